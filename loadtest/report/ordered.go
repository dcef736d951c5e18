package report

import (
	"bytes"
	"encoding/json"
	"math"
)

// Field is one key of an Object.
type Field struct {
	Key   string
	Value any
}

// Object is a JSON object that keeps its keys in order.
type Object []Field

// Add appends a key.
func (o *Object) Add(k string, v any) { *o = append(*o, Field{k, v}) }

// Get returns the value of the first field named k.
func (o Object) Get(k string) (any, bool) {
	for _, f := range o {
		if f.Key == k {
			return f.Value, true
		}
	}
	return nil, false
}

// MarshalJSON writes the fields in order. NaN and ±Inf floats become null
// (JSON has no spelling for them).
func (o Object) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, f := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := json.Marshal(f.Key)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		v, err := json.Marshal(finite(f.Value))
		if err != nil {
			return nil, err
		}
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func finite(v any) any {
	if f, ok := v.(float64); ok && (math.IsNaN(f) || math.IsInf(f, 0)) {
		return nil
	}
	return v
}
