package grammar

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// object is a JSON object that keeps its members' order: a schema's
// properties are generated in the order they are written, as llama.cpp
// (and OpenAI's structured outputs) generate them. A repeated name keeps
// its first place and its last value.
type object struct {
	keys []string
	m    map[string]any
}

func (o *object) get(k string) (any, bool) {
	v, ok := o.m[k]
	return v, ok
}

func (o *object) has(k string) bool {
	_, ok := o.m[k]
	return ok
}

// with returns a shallow copy of o with k set to v.
func (o *object) with(k string, v any) *object {
	c := &object{keys: append([]string(nil), o.keys...), m: make(map[string]any, len(o.m)+1)}
	for kk, vv := range o.m {
		c.m[kk] = vv
	}
	if _, ok := c.m[k]; !ok {
		c.keys = append(c.keys, k)
	}
	c.m[k] = v
	return c
}

// decodeOrdered decodes one JSON text: objects as *object, arrays as
// []any, numbers as json.Number. Trailing data is an error.
func decodeOrdered(data []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	v, err := decodeValue(d, 0)
	if err != nil {
		return nil, err
	}
	if _, err := d.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("data after the JSON value")
	}
	return v, nil
}

// maxNesting bounds the nesting of a decoded JSON text (encoding/json's
// own bound), so that decoding recurses no deeper.
const maxNesting = 10000

func decodeValue(d *json.Decoder, depth int) (any, error) {
	if depth > maxNesting {
		return nil, fmt.Errorf("nested deeper than %d", maxNesting)
	}
	t, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch t {
	case json.Delim('{'):
		o := &object{m: map[string]any{}}
		for d.More() {
			kt, err := d.Token()
			if err != nil {
				return nil, err
			}
			k, _ := kt.(string)
			v, err := decodeValue(d, depth+1)
			if err != nil {
				return nil, err
			}
			if _, ok := o.m[k]; !ok {
				o.keys = append(o.keys, k)
			}
			o.m[k] = v
		}
		if _, err := d.Token(); err != nil {
			return nil, err
		}
		return o, nil
	case json.Delim('['):
		a := []any{}
		for d.More() {
			v, err := decodeValue(d, depth+1)
			if err != nil {
				return nil, err
			}
			a = append(a, v)
		}
		if _, err := d.Token(); err != nil {
			return nil, err
		}
		return a, nil
	}
	return t, nil
}

// encodeJSON writes v (as decodeOrdered returns it) as compact JSON,
// objects in their order, strings with no HTML escaping (nlohmann's dump,
// which llama.cpp writes constants with).
func encodeJSON(b *strings.Builder, v any) error {
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		fmt.Fprint(b, v)
	case json.Number:
		b.WriteString(v.String())
	case string:
		var buf bytes.Buffer
		e := json.NewEncoder(&buf)
		e.SetEscapeHTML(false)
		if err := e.Encode(v); err != nil {
			return err
		}
		b.Write(bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
	case []any:
		b.WriteByte('[')
		for i, x := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := encodeJSON(b, x); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case *object:
		b.WriteByte('{')
		for i, k := range v.keys {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := encodeJSON(b, k); err != nil {
				return err
			}
			b.WriteByte(':')
			if err := encodeJSON(b, v.m[k]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		return fmt.Errorf("grammar: unexpected JSON value %T", v)
	}
	return nil
}
