package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// everyType holds a value of every metadata type, arrays of every element
// type (empty ones included) and arrays of arrays.
func everyType() Metadata {
	return Metadata{
		{"general.architecture", "test"},
		{"u8", uint8(250)},
		{"i8", int8(-7)},
		{"u16", uint16(65000)},
		{"i16", int16(-30000)},
		{"u32", uint32(4000000000)},
		{"i32", int32(-2000000000)},
		{"f32", float32(-1.5e-3)},
		{"bool.true", true},
		{"bool.false", false},
		{"str", "héllo ✓\x00end"},
		{"str.empty", ""},
		{"u64", uint64(math.MaxUint64)},
		{"i64", int64(math.MinInt64)},
		{"f64", math.Pi},
		{"arr.u8", []uint8{0, 1, 255}},
		{"arr.i8", []int8{-128, 0, 127}},
		{"arr.u16", []uint16{1, 65535}},
		{"arr.i16", []int16{-32768, 32767}},
		{"arr.u32", []uint32{7}},
		{"arr.i32", []int32{-1, 2, -3}},
		{"arr.f32", []float32{0.5, float32(math.Inf(-1)), -0}},
		{"arr.bool", []bool{true, false, true}},
		{"arr.str", []string{"a", "", "ĠĠ ĠĠ", strings.Repeat("x", 5000)}},
		{"arr.u64", []uint64{1 << 63}},
		{"arr.i64", []int64{-1 << 40}},
		{"arr.f64", []float64{1e300, -1e-300}},
		{"arr.empty.str", []string{}},
		{"arr.empty.f32", []float32{}},
		{"arr.nested", []any{[]uint32{1, 2}, []string{"x"}, []any{[]bool{true}}, []int8{}}},
		{"arr.nested.empty", []any{}},
	}
}

func testTensors(r *rand.Rand) []Tensor {
	vals := func(n int, f func() float32) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = f()
		}
		return v
	}
	normal := func() float32 { return float32(r.NormFloat64()) }
	// Halves are exact in F16.
	half := func() float32 {
		for {
			if v := F16ToF32(uint16(r.Uint32())); !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) {
				return v
			}
		}
	}
	special := []float32{0, float32(math.Copysign(0, -1)), 1e-45, math.MaxFloat32, -math.SmallestNonzeroFloat32, float32(math.Inf(1))}
	return []Tensor{
		{TensorInfo: TensorInfo{Name: "f32.special", Shape: []uint64{6}, Type: F32}, Values: special},
		{TensorInfo: TensorInfo{Name: "f32.3d", Shape: []uint64{5, 3, 2}, Type: F32}, Values: vals(30, normal)},
		{TensorInfo: TensorInfo{Name: "f16.halves", Shape: []uint64{7, 9}, Type: F16}, Values: vals(63, half)},
		{TensorInfo: TensorInfo{Name: "q8.2d", Shape: []uint64{64, 5}, Type: Q8_0}, Values: vals(320, normal)},
		{TensorInfo: TensorInfo{Name: "q8.4d", Shape: []uint64{32, 2, 3, 2}, Type: Q8_0}, Values: vals(384, normal)},
		{TensorInfo: TensorInfo{Name: "f32.1", Shape: []uint64{1}, Type: F32}, Values: []float32{42}},
	}
}

func writeBytes(t *testing.T, meta Metadata, tensors []Tensor) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := Write(&buf, meta, tensors); err != nil {
		t.Fatalf("Write: %v", err)
	}
	return buf.Bytes()
}

// wantDecoded is what decoding tensor x of type typ must give: exact for
// F32 and, on halves, F16; for Q8_0 the caller checks a bound instead.
func checkTensor(t *testing.T, tt Tensor, got []float32) {
	t.Helper()
	if len(got) != len(tt.Values) {
		t.Fatalf("%s: %d values, want %d", tt.Name, len(got), len(tt.Values))
	}
	switch tt.Type {
	case F32, F16:
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(tt.Values[i]) {
				t.Errorf("%s[%d] = %g, want %g exactly", tt.Name, i, got[i], tt.Values[i])
			}
		}
	case Q8_0:
		for b := 0; b < len(got); b += 32 {
			var amax float32
			for _, v := range tt.Values[b : b+32] {
				amax = max(amax, float32(math.Abs(float64(v))))
			}
			bound := Q8Bound(amax)
			for i := b; i < b+32; i++ {
				if e := math.Abs(float64(got[i] - tt.Values[i])); e > bound {
					t.Errorf("%s[%d] = %g, want %g within %g", tt.Name, i, got[i], tt.Values[i], bound)
				}
			}
		}
	}
}

func TestRoundTrip(t *testing.T) {
	tests := []struct {
		name  string
		align uint32 // 0: default
	}{{"default alignment", 0}, {"alignment 64", 64}, {"alignment 8", 8}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			meta := everyType()
			wantAlign := uint64(DefaultAlignment)
			if tc.align != 0 {
				meta.Set(KeyAlignment, tc.align)
				wantAlign = uint64(tc.align)
			}
			tensors := testTensors(rand.New(rand.NewPCG(5, 6)))
			path := filepath.Join(t.TempDir(), "rt.gguf")
			if err := WriteFile(path, meta, tensors); err != nil {
				t.Fatal(err)
			}
			f, err := ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(meta, f.Metadata); diff != "" {
				t.Errorf("metadata (-want +got):\n%s", diff)
			}
			if f.Version != 3 || f.Alignment != wantAlign || f.DataOffset%int64(wantAlign) != 0 {
				t.Errorf("version %d, alignment %d, data offset %d; want 3, %d, aligned", f.Version, f.Alignment, f.DataOffset, wantAlign)
			}
			fd, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer fd.Close()
			if len(f.Tensors) != len(tensors) {
				t.Fatalf("%d tensors, want %d", len(f.Tensors), len(tensors))
			}
			for i, tt := range tensors {
				info := f.Tensors[i]
				if info.Name != tt.Name || info.Type != tt.Type || !cmp.Equal(info.Shape, tt.Shape) || info.Offset%wantAlign != 0 {
					t.Errorf("tensor %d: %+v, want %s %v %v at an aligned offset", i, info, tt.Name, tt.Shape, tt.Type)
				}
				got, err := f.TensorFloat32(fd, info)
				if err != nil {
					t.Fatal(err)
				}
				checkTensor(t, tt, got)
			}
			st, _ := fd.Stat()
			if st.Size()%int64(wantAlign) != 0 {
				t.Errorf("file size %d is not padded to the alignment", st.Size())
			}
		})
	}
}

// TestStreamingMatchesWhole checks that a tensor written through Fill in
// chunks, or through Append in odd pieces, gives the same bytes as Values.
func TestStreamingMatchesWhole(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	meta := Metadata{{"general.architecture", "test"}}
	whole := testTensors(r)
	want := writeBytes(t, meta, whole)

	filled := make([]Tensor, len(whole))
	for i, tt := range whole {
		vals := tt.Values
		filled[i] = Tensor{TensorInfo: tt.TensorInfo, Fill: func(dst []float32, first uint64) error {
			if uint64(len(dst))%tt.Shape[0] != 0 {
				t.Errorf("%s: Fill of %d values, not whole rows of %d", tt.Name, len(dst), tt.Shape[0])
			}
			copy(dst, vals[first:])
			return nil
		}}
	}
	if got := writeBytes(t, meta, filled); !bytes.Equal(got, want) {
		t.Error("Fill gives different bytes than Values")
	}

	for _, piece := range []int{1, 7, 31, 33, 100} {
		infos := make([]TensorInfo, len(whole))
		for i := range whole {
			infos[i] = whole[i].TensorInfo
		}
		var buf bytes.Buffer
		w, err := NewWriter(&buf, meta, infos)
		if err != nil {
			t.Fatal(err)
		}
		for _, tt := range whole {
			for v := tt.Values; len(v) > 0; {
				k := min(piece, len(v))
				if err := w.Append(v[:k]); err != nil {
					t.Fatal(err)
				}
				v = v[k:]
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), want) {
			t.Errorf("Append in pieces of %d gives different bytes", piece)
		}
	}
}

func TestWriteErrors(t *testing.T) {
	arch := KV{"general.architecture", "test"}
	one := func(name string, shape []uint64, typ TensorType) []Tensor {
		n := uint64(1)
		for _, d := range shape {
			n *= d
		}
		return []Tensor{{TensorInfo: TensorInfo{Name: name, Shape: shape, Type: typ}, Values: make([]float32, n)}}
	}
	ok := one("t", []uint64{4}, F32)
	tests := []struct {
		name    string
		meta    Metadata
		tensors []Tensor
		want    string
	}{
		{"empty key", Metadata{{"", uint32(1)}}, ok, "empty key"},
		{"duplicate key", Metadata{arch, arch}, ok, "duplicate key"},
		{"unsupported value", Metadata{{"k", 3}}, ok, "unsupported metadata value type int"},
		{"unsupported array", Metadata{{"k", []int{1}}}, ok, "unsupported"},
		{"nested non-array", Metadata{{"k", []any{"x"}}}, ok, "not an array"},
		{"alignment not a power of two", Metadata{{KeyAlignment, uint32(48)}}, ok, "power of two"},
		{"alignment of the wrong type", Metadata{{KeyAlignment, uint64(32)}}, ok, "want uint32"},
		{"duplicate tensor", Metadata{arch}, append(one("t", []uint64{4}, F32), ok...), "duplicate name"},
		{"long name", Metadata{arch}, one(strings.Repeat("n", 64), []uint64{4}, F32), "1 to 63 bytes"},
		{"no dimensions", Metadata{arch}, one("t", nil, F32), "0 dimensions"},
		{"five dimensions", Metadata{arch}, one("t", []uint64{1, 1, 1, 1, 1}, F32), "5 dimensions"},
		{"q8_0 row not whole blocks", Metadata{arch}, one("t", []uint64{48, 2}, Q8_0), "not whole Q8_0 blocks"},
		{"unencodable type", Metadata{arch}, one("t", []uint64{32}, Q4_0), "cannot be written"},
		{"values of the wrong length", Metadata{arch}, []Tensor{{TensorInfo: TensorInfo{Name: "t", Shape: []uint64{4}, Type: F32}, Values: make([]float32, 3)}}, "3 values for shape [4]"},
		{"fill fails", Metadata{arch}, []Tensor{{TensorInfo: TensorInfo{Name: "t", Shape: []uint64{4}, Type: F32},
			Fill: func([]float32, uint64) error { return errors.New("boom") }}}, `tensor "t": fill: boom`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Write(&bytes.Buffer{}, tt.meta, tt.tensors)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Write: %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestWriterAppendErrors(t *testing.T) {
	infos := []TensorInfo{{Name: "a", Shape: []uint64{4}, Type: F32}, {Name: "b", Shape: []uint64{32}, Type: Q8_0}}
	newW := func() *Writer {
		w, err := NewWriter(&bytes.Buffer{}, nil, infos)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	w := newW()
	if err := w.Append(make([]float32, 5)); err == nil || !strings.Contains(err.Error(), "only 4 left") {
		t.Errorf("Append past a tensor's end: %v", err)
	}
	if err := w.Close(); err == nil {
		t.Error("Close after a failed Append succeeded")
	}

	w = newW()
	if err := w.Append(make([]float32, 4)); err != nil {
		t.Fatal(err)
	}
	if err := w.Append(make([]float32, 10)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err == nil || !strings.Contains(err.Error(), `tensor "b" has 10 of 32 values`) {
		t.Errorf("Close with a short tensor: %v", err)
	}

	w = newW()
	_ = w.Append(make([]float32, 4))
	_ = w.Append(make([]float32, 32))
	if err := w.Append([]float32{1}); err == nil || !strings.Contains(err.Error(), "past the last tensor") {
		t.Errorf("Append past the last tensor: %v", err)
	}
}

// TestWriteFileLeavesNothingOnError checks that a failed WriteFile leaves
// neither the file nor its temporary.
func TestWriteFileLeavesNothingOnError(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.gguf")
	err := WriteFile(path, nil, []Tensor{{TensorInfo: TensorInfo{Name: "t", Shape: []uint64{4}, Type: F32},
		Fill: func([]float32, uint64) error { return errors.New("cancelled") }}})
	if err == nil {
		t.Fatal("WriteFile succeeded")
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 0 {
		t.Errorf("directory holds %v after a failed write", ents)
	}
}

func TestReadErrors(t *testing.T) {
	meta := Metadata{{"general.architecture", "test"}, {"arr", []string{"a", "b"}}, {"b", true}}
	valid := writeBytes(t, meta, testTensors(rand.New(rand.NewPCG(1, 1)))[:2])
	f, err := Read(bytes.NewReader(valid))
	if err != nil {
		t.Fatal(err)
	}

	// Every strict prefix of the header fails with ErrFormat, none panics.
	for n := range int(f.DataOffset) - 1 {
		if _, err := Read(bytes.NewReader(valid[:n])); !errors.Is(err, ErrFormat) {
			t.Fatalf("Read of the first %d bytes: %v, want ErrFormat", n, err)
		}
	}

	patch := func(off int, b ...byte) []byte {
		c := bytes.Clone(valid)
		copy(c[off:], b)
		return c
	}
	u32 := func(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }
	u64 := func(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
	boolAt := bytes.LastIndex(valid[:f.DataOffset], append([]byte("b"), u32(uint32(TypeBool))...)) + 5
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"bad magic", patch(0, 'G', 'G', 'M', 'L'), "magic"},
		{"version 1", patch(4, u32(1)...), "version 1"},
		{"big endian", patch(4, u32(3<<24)...), "big-endian"},
		{"version 4", patch(4, u32(4)...), "version 4"},
		{"huge tensor count", patch(8, u64(1<<40)...), "out of range"},
		{"bool byte 2", patch(boolAt, 2), "neither 0 nor 1"},
		{"huge string", patch(24, u64(1<<40)...), "exceeds the limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Read(bytes.NewReader(tt.data))
			if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Read: %v, want ErrFormat containing %q", err, tt.want)
			}
		})
	}

	t.Run("truncated data", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "cut.gguf")
		if err := os.WriteFile(path, valid[:len(valid)-40], 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadFile(path); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "truncated") {
			t.Errorf("ReadFile of a truncated file: %v", err)
		}
	})
	t.Run("missing file", func(t *testing.T) {
		if _, err := ReadFile(filepath.Join(t.TempDir(), "none.gguf")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("ReadFile of a missing file: %v", err)
		}
	})
}

func TestMetadataAccessors(t *testing.T) {
	m := Metadata{{"a", uint32(7)}, {"b", int32(-1)}, {"c", "x"}, {"d", int64(9)}}
	if v, err := Lookup[uint32](m, "a"); err != nil || v != 7 {
		t.Errorf("Lookup[uint32](a) = %v, %v", v, err)
	}
	if _, err := Lookup[int](m, "a"); err == nil {
		t.Error("Lookup[int] of a uint32 succeeded")
	}
	if _, err := Lookup[string](m, "zz"); !errors.Is(err, ErrKeyNotFound) {
		t.Errorf("Lookup of a missing key: %v", err)
	}
	for key, want := range map[string]uint64{"a": 7, "d": 9} {
		if v, err := m.Uint(key); err != nil || v != want {
			t.Errorf("Uint(%s) = %d, %v; want %d", key, v, err, want)
		}
	}
	for _, key := range []string{"b", "c", "zz"} {
		if _, err := m.Uint(key); err == nil {
			t.Errorf("Uint(%s) succeeded", key)
		}
	}
	m.Set("a", uint32(8))
	m.Set("e", true)
	if !m.Delete("c") || m.Delete("c") {
		t.Error("Delete(c) twice: want true then false")
	}
	want := Metadata{{"a", uint32(8)}, {"b", int32(-1)}, {"d", int64(9)}, {"e", true}}
	if diff := cmp.Diff(want, m); diff != "" {
		t.Errorf("after Set and Delete (-want +got):\n%s", diff)
	}
}
