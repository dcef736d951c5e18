package workload

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"time"
)

// TraceRow is one request of a trace: its arrival offset and lengths.
type TraceRow struct {
	Arrival   time.Duration // from the trace's first request, ≥ 0
	InputLen  int           // prompt tokens, ≥ 1
	OutputLen int           // output tokens, ≥ 0 in the file
	HashIDs   []int64       // Mooncake: ids of the prompt's blocks, in order
	Line      int           // 1-based line in the file, for messages
}

// azureLayouts are the timestamp spellings of the Azure traces: 2023 (7-digit
// fraction, no zone) and 2024 (zone, fraction sometimes absent). Go accepts a
// fraction after the seconds even when the layout has none.
var azureLayouts = []string{
	"2006-01-02 15:04:05",
	"2006-01-02 15:04:05Z07:00",
	"2006-01-02T15:04:05",
	"2006-01-02T15:04:05Z07:00",
}

// ParseAzure parses an Azure LLM inference trace CSV with the header
// TIMESTAMP,ContextTokens,GeneratedTokens (columns found by name, any case).
// Rows are returned sorted by time, with Arrival relative to the earliest.
// Errors wrap ErrMalformed and name the line.
func ParseAzure(r io.Reader) ([]TraceRow, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = true
	head, err := cr.Read()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: azure: empty file", ErrEmpty)
		}
		return nil, fmt.Errorf("%w: azure: header: %v", ErrMalformed, err)
	}
	col := map[string]int{}
	for i, h := range head {
		col[strings.ToLower(strings.TrimSpace(strings.TrimPrefix(h, "\ufeff")))] = i
	}
	ts, okT := col["timestamp"]
	ctx, okC := col["contexttokens"]
	gen, okG := col["generatedtokens"]
	if !okT || !okC || !okG {
		return nil, fmt.Errorf("%w: azure: line 1: header %q lacks TIMESTAMP, ContextTokens or GeneratedTokens", ErrMalformed, strings.Join(head, ","))
	}
	need := max(ts, ctx, gen) + 1
	type stamped struct {
		t   time.Time
		row TraceRow
	}
	var rows []stamped
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				return nil, fmt.Errorf("%w: azure: line %d: %v", ErrMalformed, pe.Line, pe.Err)
			}
			return nil, fmt.Errorf("azure: read: %w", err)
		}
		line, _ := cr.FieldPos(0)
		if len(rec) == 1 && strings.TrimSpace(rec[0]) == "" {
			continue
		}
		if len(rec) < need {
			return nil, fmt.Errorf("%w: azure: line %d: %d fields, want %d", ErrMalformed, line, len(rec), need)
		}
		t, err := parseAzureTime(strings.TrimSpace(rec[ts]))
		if err != nil {
			return nil, fmt.Errorf("%w: azure: line %d: timestamp %q: not a trace timestamp", ErrMalformed, line, rec[ts])
		}
		in, err1 := strconv.Atoi(strings.TrimSpace(rec[ctx]))
		out, err2 := strconv.Atoi(strings.TrimSpace(rec[gen]))
		if err1 != nil || err2 != nil || in < 1 || out < 0 {
			return nil, fmt.Errorf("%w: azure: line %d: token counts %q, %q: want integers, context ≥ 1, generated ≥ 0", ErrMalformed, line, rec[ctx], rec[gen])
		}
		rows = append(rows, stamped{t: t, row: TraceRow{InputLen: in, OutputLen: out, Line: line}})
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%w: azure: no rows", ErrEmpty)
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].t.Before(rows[j].t) })
	out := make([]TraceRow, len(rows))
	for i, r := range rows {
		out[i] = r.row
		out[i].Arrival = r.t.Sub(rows[0].t)
	}
	return out, nil
}

func parseAzureTime(s string) (time.Time, error) {
	for _, l := range azureLayouts {
		if t, err := time.Parse(l, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("no layout matches %q", s)
}

type mooncakeLine struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []int64  `json:"hash_ids"`
}

// maxLineBytes bounds one JSONL line.
const maxLineBytes = 16 << 20

// ParseMooncake parses a Mooncake trace: one JSON object per line with
// timestamp (ms), input_length, output_length and hash_ids. Blank lines are
// skipped. Rows are returned sorted by time, with Arrival relative to the
// earliest. Errors wrap ErrMalformed and name the line.
func ParseMooncake(r io.Reader) ([]TraceRow, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLineBytes)
	var rows []TraceRow
	var stamps []float64
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var m mooncakeLine
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("%w: mooncake: line %d: %v", ErrMalformed, line, err)
		}
		switch {
		case m.Timestamp == nil || m.InputLength == nil || m.OutputLength == nil:
			return nil, fmt.Errorf("%w: mooncake: line %d: needs timestamp, input_length and output_length", ErrMalformed, line)
		case math.IsNaN(*m.Timestamp) || *m.Timestamp < 0:
			return nil, fmt.Errorf("%w: mooncake: line %d: timestamp %v < 0", ErrMalformed, line, *m.Timestamp)
		case *m.InputLength < 1 || *m.OutputLength < 0:
			return nil, fmt.Errorf("%w: mooncake: line %d: input_length %d must be ≥ 1 and output_length %d ≥ 0", ErrMalformed, line, *m.InputLength, *m.OutputLength)
		}
		rows = append(rows, TraceRow{InputLen: *m.InputLength, OutputLen: *m.OutputLength, HashIDs: m.HashIDs, Line: line})
		stamps = append(stamps, *m.Timestamp)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("%w: mooncake: line %d: longer than %d bytes", ErrMalformed, line+1, maxLineBytes)
		}
		return nil, fmt.Errorf("mooncake: read: %w", err)
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%w: mooncake: no rows", ErrEmpty)
	}
	idx := make([]int, len(rows))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return stamps[idx[a]] < stamps[idx[b]] })
	out := make([]TraceRow, len(rows))
	t0 := stamps[idx[0]]
	for i, k := range idx {
		out[i] = rows[k]
		out[i].Arrival = time.Duration((stamps[k] - t0) * float64(time.Millisecond))
	}
	return out, nil
}

// TraceOptions select the part of a trace to use.
type TraceOptions struct {
	// Skip drops the trace's first Skip rows (≥ 0), to start later in it.
	Skip int
	// BlockSize is the Mooncake block length in tokens (hash ids name
	// blocks of this many tokens); 0 means 512.
	BlockSize int
}

// FromTrace returns the first n rows (after Skip) of a trace as requests,
// with Arrival offsets relative to the first row kept. Output lengths of 0
// become 1 (noted). Prompts with hash ids are built block by block: block h
// has the same content in every prompt that names it, so prompts sharing a
// hash-id prefix share that prefix of tokens; a prompt's tokens past its
// blocks are its own. n ≤ 0 takes every row.
func FromTrace(name string, rows []TraceRow, o TraceOptions, n int, seed uint64, s Synth) (*Workload, error) {
	if o.Skip < 0 || o.Skip >= len(rows) {
		return nil, fmt.Errorf("%w: %s: skip %d outside the trace's %d rows", ErrBadOption, name, o.Skip, len(rows))
	}
	bs := o.BlockSize
	if bs == 0 {
		bs = 512
	}
	if bs < 0 {
		return nil, fmt.Errorf("%w: %s: block size %d < 0", ErrBadOption, name, bs)
	}
	rows = rows[o.Skip:]
	w := &Workload{Timestamps: true}
	if n > 0 && n < len(rows) {
		rows = rows[:n]
	} else if n > len(rows) {
		w.Notes = append(w.Notes, fmt.Sprintf("%s: the trace has %d rows after skipping %d; using all of them, not %d", name, len(rows), o.Skip, n))
	}
	clamped := 0
	shared := false
	w.Requests = make([]Request, len(rows))
	t0 := rows[0].Arrival
	for i, row := range rows {
		out := row.OutputLen
		if out < 1 {
			out = 1
			clamped++
		}
		shared = shared || len(row.HashIDs) > 0
		w.Requests[i] = Request{
			Index: i, PromptLen: row.InputLen, OutputLen: out, Arrival: row.Arrival - t0,
			recipe: &recipe{synth: s, seed: seed, hashIDs: row.HashIDs, blockSize: bs, total: row.InputLen},
		}
	}
	span := rows[len(rows)-1].Arrival - t0
	w.Description = fmt.Sprintf("%s trace: %d requests over %.1f s", name, len(rows), span.Seconds())
	if shared {
		w.Description += fmt.Sprintf(", %d-token hash blocks", bs)
	}
	if clamped > 0 {
		w.Notes = append(w.Notes, fmt.Sprintf("%s: %d rows with 0 output tokens ask for 1", name, clamped))
	}
	return w, nil
}

// blockRand returns the random source of hash block h: the same for every
// prompt naming h, so the block's content is identical.
func blockRand(seed uint64, h int64) *rand.Rand {
	return newRand(seed^streamBlock, uint64(h))
}
