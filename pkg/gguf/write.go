package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
)

// Writer streams a GGUF v3 file: NewWriter writes the header, Append the
// values of each tensor in order, Close the end. It holds one partial Q8_0
// block and a small encode buffer, never a whole tensor. A Writer is not
// safe for concurrent use.
type Writer struct {
	w       *bufio.Writer
	tensors []TensorInfo // with offsets
	align   uint64
	pos     uint64 // bytes written

	cur     int       // index of the tensor being written
	done    uint64    // values of tensor cur written or pending
	pending []float32 // values of tensor cur not yet encoded (< one block)
	enc     []byte    // encode buffer, reused
	err     error     // first error; the Writer is unusable after it
}

// NewWriter validates meta and the tensors, computes the tensor offsets and
// writes the header to w. The data alignment is general.alignment when meta
// holds it, else DefaultAlignment. Tensor types must be encodable (F32,
// F16, Q8_0) and rows whole blocks; names at most 63 bytes, unique; 1 to 4
// dimensions. The Writer does not close w.
func NewWriter(w io.Writer, meta Metadata, tensors []TensorInfo) (*Writer, error) {
	if err := meta.Validate(); err != nil {
		return nil, err
	}
	align, _ := meta.Alignment() // validated
	infos := make([]TensorInfo, len(tensors))
	names := make(map[string]struct{}, len(tensors))
	var off uint64
	for i, t := range tensors {
		switch {
		case t.Name == "" || len(t.Name) > maxNameLen:
			return nil, fmt.Errorf("gguf: tensor %d: name %q must be 1 to %d bytes", i, t.Name, maxNameLen)
		case len(t.Shape) == 0 || len(t.Shape) > maxDims:
			return nil, fmt.Errorf("gguf: tensor %q: %d dimensions, want 1 to %d", t.Name, len(t.Shape), maxDims)
		case !t.Type.Encodable():
			return nil, fmt.Errorf("gguf: tensor %q: type %v cannot be written (F32, F16, Q8_0 can)", t.Name, t.Type)
		}
		if _, dup := names[t.Name]; dup {
			return nil, fmt.Errorf("gguf: tensor %q: duplicate name", t.Name)
		}
		names[t.Name] = struct{}{}
		n, err := t.Size()
		if err != nil {
			return nil, err
		}
		infos[i] = TensorInfo{Name: t.Name, Shape: append([]uint64(nil), t.Shape...), Type: t.Type, Offset: off}
		off = alignUp(off+n, align)
	}
	wr := &Writer{w: bufio.NewWriterSize(w, 1<<20), tensors: infos, align: align}
	if err := wr.header(meta); err != nil {
		return nil, fmt.Errorf("gguf: write header: %w", err)
	}
	wr.skipEmpty()
	return wr, nil
}

// Tensors returns the tensors with the offsets the Writer gave them; the
// caller owns the slice.
func (w *Writer) Tensors() []TensorInfo {
	out := make([]TensorInfo, len(w.tensors))
	copy(out, w.tensors)
	return out
}

func (w *Writer) header(meta Metadata) error {
	e := encoder{w: w}
	e.bytes([]byte(Magic))
	e.u32(Version)
	e.u64(uint64(len(w.tensors)))
	e.u64(uint64(len(meta)))
	for _, kv := range meta {
		e.str(kv.Key)
		t, _ := typeOf(kv.Value) // validated
		e.u32(uint32(t))
		e.value(kv.Value)
	}
	for _, t := range w.tensors {
		e.str(t.Name)
		e.u32(uint32(len(t.Shape)))
		for _, d := range t.Shape {
			e.u64(d)
		}
		e.u32(uint32(t.Type))
		e.u64(t.Offset)
	}
	if e.err != nil {
		return e.err
	}
	if len(w.tensors) == 0 {
		return nil // no data section to align (as gguf-py writes it)
	}
	return w.pad()
}

// Append encodes vals as the next values of the current tensor: tensors are
// filled in the order given to NewWriter, each from its first value (in
// ggml order, Shape[0] fastest) to its last, over as many calls as the
// caller likes. vals must not run past the end of the current tensor. The
// Writer does not keep vals.
func (w *Writer) Append(vals []float32) error {
	if w.err != nil {
		return w.err
	}
	if len(vals) == 0 {
		return nil
	}
	if w.cur >= len(w.tensors) {
		return w.fail(fmt.Errorf("gguf: append: %d values past the last tensor", len(vals)))
	}
	t := w.tensors[w.cur]
	n := t.Elements()
	if uint64(len(vals)) > n-w.done {
		return w.fail(fmt.Errorf("gguf: append to tensor %q: %d values, only %d left", t.Name, len(vals), n-w.done))
	}
	w.done += uint64(len(vals))
	bs := int(t.Type.BlockSize())
	if len(w.pending) > 0 {
		k := min(bs-len(w.pending), len(vals))
		w.pending = append(w.pending, vals[:k]...)
		vals = vals[k:]
		if len(w.pending) < bs {
			return nil
		}
		if err := w.encode(t.Type, w.pending); err != nil {
			return err
		}
		w.pending = w.pending[:0]
	}
	whole := len(vals) / bs * bs
	if err := w.encode(t.Type, vals[:whole]); err != nil {
		return err
	}
	w.pending = append(w.pending, vals[whole:]...)
	if w.done == n { // n is whole blocks, so nothing is pending
		return w.next()
	}
	return nil
}

// encode writes whole blocks of vals in pieces of at most 64 Ki values, so
// the encode buffer stays small.
func (w *Writer) encode(t TensorType, vals []float32) error {
	const piece = 1 << 16
	for len(vals) > 0 {
		k := min(len(vals), piece)
		var err error
		if w.enc, err = AppendEncoded(w.enc[:0], t, vals[:k]); err != nil {
			return w.fail(err)
		}
		if err := w.write(w.enc); err != nil {
			return err
		}
		vals = vals[k:]
	}
	return nil
}

// next pads the finished tensor and moves to the following one.
func (w *Writer) next() error {
	if err := w.pad(); err != nil {
		return err
	}
	w.cur++
	w.done = 0
	w.skipEmpty()
	return nil
}

// skipEmpty moves past tensors with no values (a zero dimension).
func (w *Writer) skipEmpty() {
	for w.cur < len(w.tensors) && w.tensors[w.cur].Elements() == 0 {
		w.cur++
	}
}

// Close checks that every tensor was written in full and flushes. It does
// not close the underlying writer.
func (w *Writer) Close() error {
	if w.err != nil {
		return w.err
	}
	if w.cur < len(w.tensors) {
		t := w.tensors[w.cur]
		return w.fail(fmt.Errorf("gguf: close: tensor %q has %d of %d values (%d tensors not finished)",
			t.Name, w.done, t.Elements(), len(w.tensors)-w.cur))
	}
	if err := w.w.Flush(); err != nil {
		return w.fail(fmt.Errorf("gguf: write: %w", err))
	}
	return nil
}

func (w *Writer) fail(err error) error {
	if w.err == nil {
		w.err = err
	}
	return w.err
}

func (w *Writer) write(b []byte) error {
	if w.err != nil {
		return w.err
	}
	n, err := w.w.Write(b)
	w.pos += uint64(n)
	if err != nil {
		return w.fail(fmt.Errorf("gguf: write: %w", err))
	}
	return nil
}

// pad writes zeros up to the next multiple of the alignment.
func (w *Writer) pad() error {
	var zeros [256]byte
	for n := alignUp(w.pos, w.align) - w.pos; n > 0; {
		k := min(n, uint64(len(zeros)))
		if err := w.write(zeros[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// encoder writes header fields through the Writer, remembering the first
// error.
type encoder struct {
	w   *Writer
	buf [8]byte
	err error
}

func (e *encoder) bytes(b []byte) {
	if e.err == nil {
		e.err = e.w.write(b)
	}
}

func (e *encoder) u8(v uint8) { e.buf[0] = v; e.bytes(e.buf[:1]) }
func (e *encoder) u16(v uint16) {
	binary.LittleEndian.PutUint16(e.buf[:], v)
	e.bytes(e.buf[:2])
}
func (e *encoder) u32(v uint32) {
	binary.LittleEndian.PutUint32(e.buf[:], v)
	e.bytes(e.buf[:4])
}
func (e *encoder) u64(v uint64) {
	binary.LittleEndian.PutUint64(e.buf[:], v)
	e.bytes(e.buf[:8])
}
func (e *encoder) str(s string) {
	e.u64(uint64(len(s)))
	e.bytes([]byte(s))
}

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// value writes v without its type tag; v was checked by typeOf.
func (e *encoder) value(v any) {
	switch x := v.(type) {
	case uint8:
		e.u8(x)
	case int8:
		e.u8(uint8(x))
	case uint16:
		e.u16(x)
	case int16:
		e.u16(uint16(x))
	case uint32:
		e.u32(x)
	case int32:
		e.u32(uint32(x))
	case float32:
		e.u32(math.Float32bits(x))
	case bool:
		e.u8(boolByte(x))
	case string:
		e.str(x)
	case uint64:
		e.u64(x)
	case int64:
		e.u64(uint64(x))
	case float64:
		e.u64(math.Float64bits(x))
	default:
		et, _ := elemTypeOf(v)
		e.u32(uint32(et))
		switch a := v.(type) {
		case []uint8:
			e.u64(uint64(len(a)))
			e.bytes(a)
		case []int8:
			arrayOf(e, a, func(x int8) { e.u8(uint8(x)) })
		case []uint16:
			arrayOf(e, a, e.u16)
		case []int16:
			arrayOf(e, a, func(x int16) { e.u16(uint16(x)) })
		case []uint32:
			arrayOf(e, a, e.u32)
		case []int32:
			arrayOf(e, a, func(x int32) { e.u32(uint32(x)) })
		case []float32:
			arrayOf(e, a, func(x float32) { e.u32(math.Float32bits(x)) })
		case []bool:
			arrayOf(e, a, func(x bool) { e.u8(boolByte(x)) })
		case []string:
			arrayOf(e, a, e.str)
		case []uint64:
			arrayOf(e, a, e.u64)
		case []int64:
			arrayOf(e, a, func(x int64) { e.u64(uint64(x)) })
		case []float64:
			arrayOf(e, a, func(x float64) { e.u64(math.Float64bits(x)) })
		case []any:
			arrayOf(e, a, e.value) // inner arrays carry no ARRAY tag, as in gguf-py
		}
	}
}

func arrayOf[T any](e *encoder, a []T, put func(T)) {
	e.u64(uint64(len(a)))
	for _, x := range a {
		put(x)
	}
}

// Tensor is one tensor to write with Write or WriteFile: its info (Offset
// is ignored) and its values as float32, from Values or from Fill.
type Tensor struct {
	TensorInfo
	// Values holds all Elements() values in ggml order; used when Fill is
	// nil.
	Values []float32
	// Fill, when set, stores values [first, first+len(dst)) of the tensor
	// into dst. Write calls it in order of first, with dst a whole number
	// of rows of at most about a million values, so a tensor need never
	// be held in memory whole. dst is reused between calls.
	Fill func(dst []float32, first uint64) error
}

// fillChunk is the target number of values per Fill call.
const fillChunk = 1 << 20

// Write writes a GGUF v3 file of meta and tensors to w, encoding each
// tensor's values to its type as it goes.
func Write(w io.Writer, meta Metadata, tensors []Tensor) error {
	infos := make([]TensorInfo, len(tensors))
	for i, t := range tensors {
		infos[i] = t.TensorInfo
	}
	wr, err := NewWriter(w, meta, infos)
	if err != nil {
		return err
	}
	var buf []float32
	for _, t := range tensors {
		n := t.Elements()
		if t.Fill == nil {
			if uint64(len(t.Values)) != n {
				return fmt.Errorf("gguf: tensor %q: %d values for shape %v (%d)", t.Name, len(t.Values), t.Shape, n)
			}
			if err := wr.Append(t.Values); err != nil {
				return err
			}
			continue
		}
		row := max(t.Shape[0], 1)
		per := max(fillChunk/row, 1) * row
		for first := uint64(0); first < n; first += per {
			k := min(per, n-first)
			if uint64(cap(buf)) < k {
				buf = make([]float32, k)
			}
			if err := t.Fill(buf[:k], first); err != nil {
				return fmt.Errorf("gguf: tensor %q: fill: %w", t.Name, err)
			}
			if err := wr.Append(buf[:k]); err != nil {
				return err
			}
		}
	}
	return wr.Close()
}

// WriteFile writes a GGUF v3 file of meta and tensors at path, through a
// temporary file in the same directory renamed at the end, so path holds
// either the whole new file or what it held before. The file is created
// with mode 0644.
func WriteFile(path string, meta Metadata, tensors []Tensor) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("gguf: write: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if err := Write(tmp, meta, tensors); err != nil {
		return fmt.Errorf("gguf: write %s: %w", path, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		return fmt.Errorf("gguf: write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("gguf: write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("gguf: write %s: %w", path, err)
	}
	return nil
}
