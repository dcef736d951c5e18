package gguf

import (
	"fmt"
	"strings"
)

// Magic is the first four bytes of every GGUF file.
const Magic = "GGUF"

// Version is the GGUF version this package writes. It reads versions 2
// and 3 (same little-endian layout); version 1 used 32-bit counts and is
// rejected.
const Version uint32 = 3

// DefaultAlignment is the alignment in bytes of the data section and of
// every tensor in it when the metadata holds no general.alignment.
const DefaultAlignment = 32

// Well-known metadata keys.
const (
	KeyArchitecture        = "general.architecture"
	KeyName                = "general.name"
	KeyAlignment           = "general.alignment"
	KeyFileType            = "general.file_type"
	KeyQuantizationVersion = "general.quantization_version"
	KeyTokens              = "tokenizer.ggml.tokens"
)

// maxDims is ggml's GGML_MAX_DIMS: a tensor has 1 to 4 dimensions.
const maxDims = 4

// maxNameLen is ggml's GGML_MAX_NAME minus the terminating NUL: the
// longest tensor name llama.cpp loads, in bytes.
const maxNameLen = 63

// ValueType is the type tag of a metadata value, as stored in the file.
type ValueType uint32

// The metadata value types, numbered as in GGUF.
const (
	TypeUint8   ValueType = 0
	TypeInt8    ValueType = 1
	TypeUint16  ValueType = 2
	TypeInt16   ValueType = 3
	TypeUint32  ValueType = 4
	TypeInt32   ValueType = 5
	TypeFloat32 ValueType = 6
	TypeBool    ValueType = 7
	TypeString  ValueType = 8
	TypeArray   ValueType = 9
	TypeUint64  ValueType = 10
	TypeInt64   ValueType = 11
	TypeFloat64 ValueType = 12
)

var valueTypeNames = [...]string{
	TypeUint8: "uint8", TypeInt8: "int8", TypeUint16: "uint16", TypeInt16: "int16",
	TypeUint32: "uint32", TypeInt32: "int32", TypeFloat32: "float32", TypeBool: "bool",
	TypeString: "string", TypeArray: "array", TypeUint64: "uint64", TypeInt64: "int64",
	TypeFloat64: "float64",
}

func (t ValueType) String() string {
	if int(t) < len(valueTypeNames) {
		return valueTypeNames[t]
	}
	return fmt.Sprintf("ValueType(%d)", uint32(t))
}

// valid reports whether t is one of the thirteen GGUF value types.
func (t ValueType) valid() bool { return int(t) < len(valueTypeNames) }

// TensorType is a ggml tensor type (ggml_type), as stored in a tensor info.
type TensorType uint32

// Tensor types. This package encodes and decodes F32, F16 and Q8_0; it
// reads the headers of files holding any type in the table below (sizes
// from gguf-py's GGML_QUANT_SIZES).
const (
	F32  TensorType = 0
	F16  TensorType = 1
	Q4_0 TensorType = 2
	Q4_1 TensorType = 3
	Q5_0 TensorType = 6
	Q5_1 TensorType = 7
	Q8_0 TensorType = 8
	Q8_1 TensorType = 9
	Q2_K TensorType = 10
	Q3_K TensorType = 11
	Q4_K TensorType = 12
	Q5_K TensorType = 13
	Q6_K TensorType = 14
	Q8_K TensorType = 15
	BF16 TensorType = 30
)

// typeTraits is one row of ggml's type table: values per block and bytes
// per block.
type typeTraits struct {
	name      string
	blockSize uint64
	typeSize  uint64
}

const qkK = 256

var tensorTypes = map[TensorType]typeTraits{
	0:  {"F32", 1, 4},
	1:  {"F16", 1, 2},
	2:  {"Q4_0", 32, 2 + 16},
	3:  {"Q4_1", 32, 2 + 2 + 16},
	6:  {"Q5_0", 32, 2 + 4 + 16},
	7:  {"Q5_1", 32, 2 + 2 + 4 + 16},
	8:  {"Q8_0", 32, 2 + 32},
	9:  {"Q8_1", 32, 4 + 4 + 32},
	10: {"Q2_K", qkK, 2 + 2 + qkK/16 + qkK/4},
	11: {"Q3_K", qkK, 2 + qkK/4 + qkK/8 + 12},
	12: {"Q4_K", qkK, 2 + 2 + qkK/2 + 12},
	13: {"Q5_K", qkK, 2 + 2 + qkK/2 + qkK/8 + 12},
	14: {"Q6_K", qkK, 2 + qkK/2 + qkK/4 + qkK/16},
	15: {"Q8_K", qkK, 4 + qkK + qkK/8},
	16: {"IQ2_XXS", qkK, 2 + qkK/4},
	17: {"IQ2_XS", qkK, 2 + qkK/4 + qkK/32},
	18: {"IQ3_XXS", qkK, 2 + qkK/4 + qkK/8},
	19: {"IQ1_S", qkK, 2 + qkK/8 + qkK/16},
	20: {"IQ4_NL", 32, 2 + 16},
	21: {"IQ3_S", qkK, 2 + qkK/4 + qkK/8 + qkK/32 + 4},
	22: {"IQ2_S", qkK, 2 + qkK/4 + qkK/16},
	23: {"IQ4_XS", qkK, 2 + 2 + qkK/2 + qkK/64},
	24: {"I8", 1, 1},
	25: {"I16", 1, 2},
	26: {"I32", 1, 4},
	27: {"I64", 1, 8},
	28: {"F64", 1, 8},
	29: {"IQ1_M", qkK, qkK/8 + qkK/16 + qkK/32},
	30: {"BF16", 1, 2},
	34: {"TQ1_0", qkK, 2 + 4*13},
	35: {"TQ2_0", qkK, 2 + 64},
	39: {"MXFP4", 32, 1 + 16},
	40: {"NVFP4", 64, 4 + 32},
	41: {"Q1_0", 128, 2 + 16},
	42: {"Q2_0", 64, 2 + 16},
}

func (t TensorType) String() string {
	if tr, ok := tensorTypes[t]; ok {
		return tr.name
	}
	return fmt.Sprintf("TensorType(%d)", uint32(t))
}

// ParseTensorType returns the type named s, case-insensitively ("f16",
// "Q8_0").
func ParseTensorType(s string) (TensorType, error) {
	for t, tr := range tensorTypes {
		if strings.EqualFold(tr.name, s) {
			return t, nil
		}
	}
	return 0, fmt.Errorf("gguf: unknown tensor type %q", s)
}

// Known reports whether the block layout of t is known, so that the byte
// size of a tensor of type t can be computed.
func (t TensorType) Known() bool { _, ok := tensorTypes[t]; return ok }

// BlockSize is the number of values in one block of t (1 for the plain
// types, 32 for Q8_0); 0 for an unknown type.
func (t TensorType) BlockSize() uint64 { return tensorTypes[t].blockSize }

// TypeSize is the number of bytes of one block of t (4 for F32, 34 for
// Q8_0); 0 for an unknown type.
func (t TensorType) TypeSize() uint64 { return tensorTypes[t].typeSize }

// Encodable reports whether this package can encode float32 values as t
// and decode them back.
func (t TensorType) Encodable() bool { return t == F32 || t == F16 || t == Q8_0 }

// FileType is the general.file_type value (llama_ftype) of a model whose
// two-dimensional weights are of type t: 0 all F32, 1 mostly F16, 7 mostly
// Q8_0. ok is false for types without a file type here.
func (t TensorType) FileType() (ft uint32, ok bool) {
	switch t {
	case F32:
		return 0, true
	case F16:
		return 1, true
	case Q8_0:
		return 7, true
	case BF16:
		return 32, true
	}
	return 0, false
}
