package gguf

import (
	"errors"
	"fmt"
	"math/bits"
)

// KV is one metadata key-value pair.
//
// Value holds one of the Go types below, which map one-to-one onto GGUF
// value types:
//
//	uint8 int8 uint16 int16 uint32 int32 uint64 int64 float32 float64 bool string
//	[]uint8 []int8 … []string   an array of that element type
//	[]any                       an array of arrays, each element itself an array value
//	                            (gguf-py reads these; llama.cpp rejects them)
//
// Any other type is an error when the metadata is written.
type KV struct {
	Key   string
	Value any
}

// Metadata is the ordered key-value section of a GGUF file. Keys are
// unique and non-empty; Write keeps the order. A Metadata read from a file
// owns its slices (strings, arrays); callers may keep them.
type Metadata []KV

// ErrKeyNotFound is returned (wrapped) by Lookup and Metadata.Uint for an
// absent key.
var ErrKeyNotFound = errors.New("key not found")

// Index returns the position of key in m, or -1.
func (m Metadata) Index(key string) int {
	for i := range m {
		if m[i].Key == key {
			return i
		}
	}
	return -1
}

// Get returns the value of key and whether it is present.
func (m Metadata) Get(key string) (any, bool) {
	if i := m.Index(key); i >= 0 {
		return m[i].Value, true
	}
	return nil, false
}

// Set replaces the value of key in place, or appends the pair when key is
// absent.
func (m *Metadata) Set(key string, v any) {
	if i := m.Index(key); i >= 0 {
		(*m)[i].Value = v
		return
	}
	*m = append(*m, KV{Key: key, Value: v})
}

// Delete removes key and reports whether it was present.
func (m *Metadata) Delete(key string) bool {
	i := m.Index(key)
	if i < 0 {
		return false
	}
	*m = append((*m)[:i], (*m)[i+1:]...)
	return true
}

// Lookup returns the value of key as a T. It fails with an error wrapping
// ErrKeyNotFound when key is absent, and with a type error when the value
// is not a T (no numeric conversion: a uint32 key is not an int).
func Lookup[T any](m Metadata, key string) (T, error) {
	var zero T
	v, ok := m.Get(key)
	if !ok {
		return zero, fmt.Errorf("gguf: %s: %w", key, ErrKeyNotFound)
	}
	t, ok := v.(T)
	if !ok {
		return zero, fmt.Errorf("gguf: %s: value is %T, want %T", key, v, zero)
	}
	return t, nil
}

// Uint returns the value of key when it is a non-negative integer of any
// width (token ids and lengths are uint32 in some files, int32 or uint64 in
// others). It fails with an error wrapping ErrKeyNotFound when key is
// absent.
func (m Metadata) Uint(key string) (uint64, error) {
	v, ok := m.Get(key)
	if !ok {
		return 0, fmt.Errorf("gguf: %s: %w", key, ErrKeyNotFound)
	}
	var s int64
	switch x := v.(type) {
	case uint8:
		return uint64(x), nil
	case uint16:
		return uint64(x), nil
	case uint32:
		return uint64(x), nil
	case uint64:
		return x, nil
	case int8:
		s = int64(x)
	case int16:
		s = int64(x)
	case int32:
		s = int64(x)
	case int64:
		s = x
	default:
		return 0, fmt.Errorf("gguf: %s: value is %T, not an integer", key, v)
	}
	if s < 0 {
		return 0, fmt.Errorf("gguf: %s: value %d is negative", key, s)
	}
	return uint64(s), nil
}

// Alignment returns the data alignment in bytes the metadata asks for:
// general.alignment (a uint32 power of two) or DefaultAlignment.
func (m Metadata) Alignment() (uint64, error) {
	v, ok := m.Get(KeyAlignment)
	if !ok {
		return DefaultAlignment, nil
	}
	a, ok := v.(uint32)
	if !ok {
		return 0, fmt.Errorf("gguf: %s: value is %T, want uint32", KeyAlignment, v)
	}
	if a == 0 || bits.OnesCount32(a) != 1 {
		return 0, fmt.Errorf("gguf: %s: %d is not a power of two", KeyAlignment, a)
	}
	return uint64(a), nil
}

// Validate checks that every key is non-empty and unique, every value is of
// a supported type, and general.alignment, when present, is valid.
func (m Metadata) Validate() error {
	seen := make(map[string]struct{}, len(m))
	for _, kv := range m {
		if kv.Key == "" {
			return errors.New("gguf: metadata: empty key")
		}
		if _, dup := seen[kv.Key]; dup {
			return fmt.Errorf("gguf: metadata: duplicate key %q", kv.Key)
		}
		seen[kv.Key] = struct{}{}
		if _, err := typeOf(kv.Value); err != nil {
			return fmt.Errorf("gguf: metadata: key %q: %w", kv.Key, err)
		}
	}
	_, err := m.Alignment()
	return err
}

// typeOf returns the GGUF type of a value, checking nested arrays
// recursively.
func typeOf(v any) (ValueType, error) {
	switch x := v.(type) {
	case uint8:
		return TypeUint8, nil
	case int8:
		return TypeInt8, nil
	case uint16:
		return TypeUint16, nil
	case int16:
		return TypeInt16, nil
	case uint32:
		return TypeUint32, nil
	case int32:
		return TypeInt32, nil
	case float32:
		return TypeFloat32, nil
	case bool:
		return TypeBool, nil
	case string:
		return TypeString, nil
	case uint64:
		return TypeUint64, nil
	case int64:
		return TypeInt64, nil
	case float64:
		return TypeFloat64, nil
	case []any:
		for i, e := range x {
			t, err := typeOf(e)
			if err != nil {
				return 0, fmt.Errorf("element %d: %w", i, err)
			}
			if t != TypeArray {
				return 0, fmt.Errorf("element %d of an array of arrays is %T, not an array", i, e)
			}
		}
		return TypeArray, nil
	}
	if _, err := elemTypeOf(v); err != nil {
		return 0, err
	}
	return TypeArray, nil
}

// elemTypeOf returns the element type of an array value.
func elemTypeOf(v any) (ValueType, error) {
	switch v.(type) {
	case []uint8:
		return TypeUint8, nil
	case []int8:
		return TypeInt8, nil
	case []uint16:
		return TypeUint16, nil
	case []int16:
		return TypeInt16, nil
	case []uint32:
		return TypeUint32, nil
	case []int32:
		return TypeInt32, nil
	case []float32:
		return TypeFloat32, nil
	case []bool:
		return TypeBool, nil
	case []string:
		return TypeString, nil
	case []uint64:
		return TypeUint64, nil
	case []int64:
		return TypeInt64, nil
	case []float64:
		return TypeFloat64, nil
	case []any:
		return TypeArray, nil
	}
	return 0, fmt.Errorf("unsupported metadata value type %T", v)
}
