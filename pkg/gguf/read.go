package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// Limits on lengths read from a file, as in ggml's gguf.cpp: a corrupt
// length fails instead of allocating without bound.
const (
	maxStringLen = 1 << 30 // bytes
	maxArrayLen  = 1 << 30 // elements
	// preallocCap bounds the capacity allocated up front for an array;
	// longer arrays grow as their elements arrive.
	preallocCap = 1 << 16
)

// ErrFormat is returned (wrapped) for input that is not a valid GGUF file
// of a version this package reads.
var ErrFormat = errors.New("invalid GGUF")

// TensorInfo describes one tensor of a file.
type TensorInfo struct {
	Name string
	// Shape is ggml's ne: Shape[0] is the length of a row (the contiguous,
	// innermost dimension), Shape[1] the number of rows, and so on. A
	// weight multiplying an n-vector into an m-vector is {n, m}.
	Shape []uint64
	Type  TensorType
	// Offset is the position of the tensor's data in bytes from the start
	// of the data section (File.DataOffset); a multiple of the alignment.
	// Writers compute it and ignore what callers set.
	Offset uint64
}

// Elements returns the number of values in the tensor.
func (t TensorInfo) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Size returns the size of the tensor's data in bytes, without padding. It
// fails for an unknown type or rows that are not whole blocks.
func (t TensorInfo) Size() (uint64, error) {
	if len(t.Shape) > 0 && t.Type.Known() && t.Shape[0]%t.Type.BlockSize() != 0 {
		return 0, fmt.Errorf("gguf: tensor %q: row of %d values is not whole %v blocks of %d",
			t.Name, t.Shape[0], t.Type, t.Type.BlockSize())
	}
	n, err := EncodedSize(t.Type, t.Elements())
	if err != nil {
		return 0, fmt.Errorf("gguf: tensor %q: %w", t.Name, err)
	}
	return n, nil
}

// File is the header of a GGUF file: its metadata and tensor infos. The
// tensor data stays in the file; read it with TensorData or
// TensorFloat32.
type File struct {
	Version  uint32
	Metadata Metadata
	Tensors  []TensorInfo
	// Alignment of the data section and of each tensor, in bytes.
	Alignment uint64
	// DataOffset is the position of the data section in bytes from the
	// start of the file.
	DataOffset int64

	// kvSpans[i] is the byte range [start, end) of Metadata[i] in the file.
	kvSpans [][2]int64
}

// ReadFile reads the header (metadata and tensor infos) of the GGUF file at
// path and checks that the file holds all the tensor data it describes. It
// returns an error wrapping ErrFormat for a malformed file.
func ReadFile(path string) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gguf: read: %w", err)
	}
	defer fd.Close()
	f, err := decode(bufio.NewReaderSize(fd, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("gguf: read %s: %w", path, err)
	}
	st, err := fd.Stat()
	if err != nil {
		return nil, fmt.Errorf("gguf: read %s: %w", path, err)
	}
	if end := f.DataEnd(); len(f.Tensors) > 0 && end > st.Size() {
		return nil, fmt.Errorf("gguf: read %s: %w: file of %d bytes is truncated, tensor data ends at %d",
			path, ErrFormat, st.Size(), end)
	}
	return f, nil
}

// Read reads a GGUF header from r, which is left somewhere before the data
// section. It returns an error wrapping ErrFormat for malformed input.
func Read(r io.Reader) (*File, error) {
	f, err := decode(r)
	if err != nil {
		return nil, fmt.Errorf("gguf: read: %w", err)
	}
	return f, nil
}

func decode(r io.Reader) (*File, error) {
	d := &decoder{r: r}
	f, err := d.file()
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("%w at byte %d: %w", ErrFormat, d.pos, err)
	}
	return f, nil
}

// Tensor returns the info of the tensor called name.
func (f *File) Tensor(name string) (TensorInfo, bool) {
	for _, t := range f.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return TensorInfo{}, false
}

// DataEnd returns the position in bytes just past the data of the last
// tensor whose size is known (padding excluded); DataOffset when there is
// none.
func (f *File) DataEnd() int64 {
	end := f.DataOffset
	for _, t := range f.Tensors {
		if n, err := t.Size(); err == nil {
			end = max(end, f.DataOffset+int64(t.Offset+n))
		}
	}
	return end
}

// TensorData reads the raw data of tensor t from r, the file f was read
// from, into a new slice the caller owns.
func (f *File) TensorData(r io.ReaderAt, t TensorInfo) ([]byte, error) {
	n, err := t.Size()
	if err != nil {
		return nil, err
	}
	buf := make([]byte, n)
	if _, err := r.ReadAt(buf, f.DataOffset+int64(t.Offset)); err != nil {
		return nil, fmt.Errorf("gguf: read tensor %q: %w", t.Name, err)
	}
	return buf, nil
}

// TensorFloat32 reads and decodes tensor t (F32, F16 or Q8_0) from r, the
// file f was read from, into a new slice the caller owns.
func (f *File) TensorFloat32(r io.ReaderAt, t TensorInfo) ([]float32, error) {
	raw, err := f.TensorData(r, t)
	if err != nil {
		return nil, err
	}
	v, err := DecodeFloat32(t.Type, raw)
	if err != nil {
		return nil, fmt.Errorf("gguf: tensor %q: %w", t.Name, err)
	}
	return v, nil
}

// decoder reads little-endian GGUF fields and counts the bytes read.
type decoder struct {
	r   io.Reader
	pos int64
	buf [8]byte
}

func (d *decoder) read(p []byte) error {
	n, err := io.ReadFull(d.r, p)
	d.pos += int64(n)
	return err
}

func (d *decoder) u8() (uint8, error) {
	err := d.read(d.buf[:1])
	return d.buf[0], err
}

func (d *decoder) u16() (uint16, error) {
	err := d.read(d.buf[:2])
	return binary.LittleEndian.Uint16(d.buf[:2]), err
}

func (d *decoder) u32() (uint32, error) {
	err := d.read(d.buf[:4])
	return binary.LittleEndian.Uint32(d.buf[:4]), err
}

func (d *decoder) u64() (uint64, error) {
	err := d.read(d.buf[:8])
	return binary.LittleEndian.Uint64(d.buf[:8]), err
}

func (d *decoder) str() (string, error) {
	n, err := d.u64()
	if err != nil {
		return "", err
	}
	if n > maxStringLen {
		return "", fmt.Errorf("string of %d bytes exceeds the limit of %d", n, maxStringLen)
	}
	b := make([]byte, n)
	if err := d.read(b); err != nil {
		return "", err
	}
	return string(b), nil
}

func (d *decoder) file() (*File, error) {
	var magic [4]byte
	if err := d.read(magic[:]); err != nil {
		return nil, fmt.Errorf("magic: %w", err)
	}
	if string(magic[:]) != Magic {
		return nil, fmt.Errorf("magic %q, want %q", magic[:], Magic)
	}
	f := &File{}
	var err error
	if f.Version, err = d.u32(); err != nil {
		return nil, fmt.Errorf("version: %w", err)
	}
	switch {
	case f.Version == 1:
		return nil, errors.New("GGUF version 1 is not supported")
	case f.Version&0xffff == 0 && f.Version != 0:
		return nil, fmt.Errorf("version %#x: a big-endian file, not supported", f.Version)
	case f.Version != 2 && f.Version != 3:
		return nil, fmt.Errorf("version %d not supported (2 and 3 are)", f.Version)
	}
	nTensors, err := d.u64()
	if err != nil {
		return nil, fmt.Errorf("tensor count: %w", err)
	}
	nKV, err := d.u64()
	if err != nil {
		return nil, fmt.Errorf("metadata count: %w", err)
	}
	if nTensors > math.MaxInt32 || nKV > math.MaxInt32 {
		return nil, fmt.Errorf("counts of %d tensors and %d keys are out of range", nTensors, nKV)
	}

	f.Metadata = make(Metadata, 0, min(nKV, preallocCap))
	f.kvSpans = make([][2]int64, 0, min(nKV, preallocCap))
	seen := make(map[string]struct{}, min(nKV, preallocCap))
	for i := range nKV {
		start := d.pos
		kv, err := d.kv()
		if err != nil {
			return nil, fmt.Errorf("metadata %d: %w", i, err)
		}
		if _, dup := seen[kv.Key]; dup {
			return nil, fmt.Errorf("metadata %d: duplicate key %q", i, kv.Key)
		}
		seen[kv.Key] = struct{}{}
		f.Metadata = append(f.Metadata, kv)
		f.kvSpans = append(f.kvSpans, [2]int64{start, d.pos})
	}
	if f.Alignment, err = f.Metadata.Alignment(); err != nil {
		return nil, err
	}

	f.Tensors = make([]TensorInfo, 0, min(nTensors, preallocCap))
	names := make(map[string]struct{}, min(nTensors, preallocCap))
	for i := range nTensors {
		t, err := d.tensorInfo()
		if err != nil {
			return nil, fmt.Errorf("tensor info %d: %w", i, err)
		}
		if _, dup := names[t.Name]; dup {
			return nil, fmt.Errorf("tensor info %d: duplicate name %q", i, t.Name)
		}
		names[t.Name] = struct{}{}
		f.Tensors = append(f.Tensors, t)
	}
	f.DataOffset = int64(alignUp(uint64(d.pos), f.Alignment))
	if err := f.checkOffsets(); err != nil {
		return nil, err
	}
	return f, nil
}

// checkOffsets checks that the tensors lie in order, each at the aligned
// end of the previous one, as ggml requires. The check stops at the first
// tensor of unknown type.
func (f *File) checkOffsets() error {
	var want uint64
	for _, t := range f.Tensors {
		if t.Offset%f.Alignment != 0 {
			return fmt.Errorf("tensor %q: offset %d is not a multiple of the alignment %d", t.Name, t.Offset, f.Alignment)
		}
		if !t.Type.Known() {
			return nil
		}
		if t.Offset != want {
			return fmt.Errorf("tensor %q: offset %d, want %d (tensors must be contiguous, in order)", t.Name, t.Offset, want)
		}
		n, err := t.Size()
		if err != nil {
			return err
		}
		want = alignUp(t.Offset+n, f.Alignment)
	}
	return nil
}

func (d *decoder) tensorInfo() (TensorInfo, error) {
	var t TensorInfo
	var err error
	if t.Name, err = d.str(); err != nil {
		return t, fmt.Errorf("name: %w", err)
	}
	if len(t.Name) > maxNameLen {
		return t, fmt.Errorf("name %q is longer than %d bytes", t.Name, maxNameLen)
	}
	nDims, err := d.u32()
	if err != nil {
		return t, fmt.Errorf("tensor %q: dimension count: %w", t.Name, err)
	}
	if nDims > maxDims {
		return t, fmt.Errorf("tensor %q: %d dimensions, at most %d", t.Name, nDims, maxDims)
	}
	t.Shape = make([]uint64, nDims)
	total := uint64(1)
	for j := range t.Shape {
		if t.Shape[j], err = d.u64(); err != nil {
			return t, fmt.Errorf("tensor %q: dimension %d: %w", t.Name, j, err)
		}
		if t.Shape[j] > math.MaxInt64 {
			return t, fmt.Errorf("tensor %q: dimension %d of %d is out of range", t.Name, j, t.Shape[j])
		}
		if t.Shape[j] != 0 && total > math.MaxInt64/t.Shape[j] {
			return t, fmt.Errorf("tensor %q: shape %v has too many elements", t.Name, t.Shape)
		}
		total *= t.Shape[j]
	}
	typ, err := d.u32()
	if err != nil {
		return t, fmt.Errorf("tensor %q: type: %w", t.Name, err)
	}
	t.Type = TensorType(typ)
	if t.Offset, err = d.u64(); err != nil {
		return t, fmt.Errorf("tensor %q: offset: %w", t.Name, err)
	}
	if t.Type.Known() {
		if _, err := t.Size(); err != nil {
			return t, err
		}
	}
	return t, nil
}

func (d *decoder) kv() (KV, error) {
	key, err := d.str()
	if err != nil {
		return KV{}, fmt.Errorf("key: %w", err)
	}
	if key == "" {
		return KV{}, errors.New("empty key")
	}
	typ, err := d.u32()
	if err != nil {
		return KV{}, fmt.Errorf("key %q: type: %w", key, err)
	}
	v, err := d.value(ValueType(typ), 0)
	if err != nil {
		return KV{}, fmt.Errorf("key %q: %w", key, err)
	}
	return KV{Key: key, Value: v}, nil
}

// maxArrayDepth bounds the nesting of arrays of arrays.
const maxArrayDepth = 8

func (d *decoder) value(t ValueType, depth int) (any, error) {
	switch t {
	case TypeUint8:
		return d.u8()
	case TypeInt8:
		v, err := d.u8()
		return int8(v), err
	case TypeUint16:
		return d.u16()
	case TypeInt16:
		v, err := d.u16()
		return int16(v), err
	case TypeUint32:
		return d.u32()
	case TypeInt32:
		v, err := d.u32()
		return int32(v), err
	case TypeFloat32:
		v, err := d.u32()
		return math.Float32frombits(v), err
	case TypeBool:
		v, err := d.u8()
		if err == nil && v > 1 {
			err = fmt.Errorf("bool byte %d is neither 0 nor 1", v)
		}
		return v == 1, err
	case TypeString:
		return d.str()
	case TypeUint64:
		return d.u64()
	case TypeInt64:
		v, err := d.u64()
		return int64(v), err
	case TypeFloat64:
		v, err := d.u64()
		return math.Float64frombits(v), err
	case TypeArray:
		if depth >= maxArrayDepth {
			return nil, fmt.Errorf("arrays nested deeper than %d", maxArrayDepth)
		}
		et, err := d.u32()
		if err != nil {
			return nil, fmt.Errorf("array element type: %w", err)
		}
		n, err := d.u64()
		if err != nil {
			return nil, fmt.Errorf("array length: %w", err)
		}
		if n > maxArrayLen {
			return nil, fmt.Errorf("array of %d elements exceeds the limit of %d", n, maxArrayLen)
		}
		return d.array(ValueType(et), int(n), depth)
	}
	return nil, fmt.Errorf("unknown value type %d", uint32(t))
}

// array reads n elements of type et into the typed slice for et.
func (d *decoder) array(et ValueType, n, depth int) (any, error) {
	switch et {
	case TypeUint8:
		return readNums(d, n, 1, func(b []byte) uint8 { return b[0] })
	case TypeInt8:
		return readNums(d, n, 1, func(b []byte) int8 { return int8(b[0]) })
	case TypeUint16:
		return readNums(d, n, 2, binary.LittleEndian.Uint16)
	case TypeInt16:
		return readNums(d, n, 2, func(b []byte) int16 { return int16(binary.LittleEndian.Uint16(b)) })
	case TypeUint32:
		return readNums(d, n, 4, binary.LittleEndian.Uint32)
	case TypeInt32:
		return readNums(d, n, 4, func(b []byte) int32 { return int32(binary.LittleEndian.Uint32(b)) })
	case TypeFloat32:
		return readNums(d, n, 4, func(b []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b)) })
	case TypeUint64:
		return readNums(d, n, 8, binary.LittleEndian.Uint64)
	case TypeInt64:
		return readNums(d, n, 8, func(b []byte) int64 { return int64(binary.LittleEndian.Uint64(b)) })
	case TypeFloat64:
		return readNums(d, n, 8, func(b []byte) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(b)) })
	case TypeBool:
		out := make([]bool, 0, min(n, preallocCap))
		for i := range n {
			v, err := d.u8()
			if err != nil {
				return nil, fmt.Errorf("element %d: %w", i, err)
			}
			if v > 1 {
				return nil, fmt.Errorf("element %d: bool byte %d is neither 0 nor 1", i, v)
			}
			out = append(out, v == 1)
		}
		return out, nil
	case TypeString:
		out := make([]string, 0, min(n, preallocCap))
		for i := range n {
			s, err := d.str()
			if err != nil {
				return nil, fmt.Errorf("element %d: %w", i, err)
			}
			out = append(out, s)
		}
		return out, nil
	case TypeArray:
		out := make([]any, 0, min(n, preallocCap))
		for i := range n {
			v, err := d.value(TypeArray, depth+1)
			if err != nil {
				return nil, fmt.Errorf("element %d: %w", i, err)
			}
			out = append(out, v)
		}
		return out, nil
	}
	return nil, fmt.Errorf("unknown array element type %d", uint32(et))
}

// readNums reads n fixed-size numbers of size bytes each, in chunks.
func readNums[T any](d *decoder, n, size int, conv func([]byte) T) ([]T, error) {
	out := make([]T, 0, min(n, preallocCap))
	var chunk [4096]byte
	per := len(chunk) / size
	for len(out) < n {
		k := min(n-len(out), per)
		b := chunk[:k*size]
		if err := d.read(b); err != nil {
			return nil, fmt.Errorf("element %d: %w", len(out), err)
		}
		for i := 0; i < len(b); i += size {
			out = append(out, conv(b[i:i+size]))
		}
	}
	return out, nil
}

func alignUp(n, a uint64) uint64 { return (n + a - 1) / a * a }
