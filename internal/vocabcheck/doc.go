// Package vocabcheck holds no code: its test keeps the wire vocabulary in
// one place (pkg/wire/vocab, and the protobuf enums of api/pdserve/v1 that
// pkg/wire maps it to). It parses the module's Go sources (tests and
// generated code aside) and fails on a copy:
//   - a constant named as a word of the vocabulary (Mode…, Policy…,
//     Finish…, Stamp…, MaxRequestID, DefaultBlockTokens) whose value is a
//     literal rather than a name of pkg/wire/vocab;
//   - a string literal that spells a stamp's wire name (pdservev1.StampKind
//     lowercased, "kv_done", …; but "first_token", also a budget term),
//     which only the enum may carry;
//   - in the request's cores (the coordinator, the workers), a string
//     literal that spells a finish reason or a serving mode of vocab.
package vocabcheck
