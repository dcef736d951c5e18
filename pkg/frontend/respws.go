package frontend

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/zap"
)

// Bounds of a Responses API WebSocket.
const (
	// wsMaxConcurrent is the most responses one socket generates at
	// once (its stream_id lanes); a response.create beyond gets an error
	// event.
	wsMaxConcurrent = 4
	// wsMaxQueued is the most response.create events one socket holds
	// waiting in its lanes.
	wsMaxQueued = 64
	// wsIdleTimeout closes a socket that sent nothing and generates
	// nothing for that long.
	wsIdleTimeout = 5 * time.Minute
	// wsPingInterval is how often the server pings; a socket whose pong
	// does not come within it is closed.
	wsPingInterval = 30 * time.Second
	// wsRemember is how many of its last responses a socket keeps for
	// previous_response_id (also with store false).
	wsRemember = 16
)

// wsSocket is one Responses API WebSocket: its lanes (stream_id: FIFO)
// and the conversations of its last responses.
type wsSocket struct {
	s     *Server
	conn  *websocket.Conn
	r     *http.Request // the upgrade
	owner string
	// ctx ends when the socket closes: every generation stops.
	ctx context.Context

	wmu sync.Mutex // one writer at a time

	mu      sync.Mutex
	lanes   map[string][]json.RawMessage // waiting events per stream_id
	running map[string]bool              // lanes with a response in flight
	queued  int
	active  int
	convs   map[string][]chatMsg // response id → conversation, the last wsRemember
	order   []string
	last    time.Time // last activity, for the idle timeout
	wg      sync.WaitGroup
}

// isUpgrade reports whether r asks for a WebSocket.
func isUpgrade(r *http.Request) bool {
	return r.Method == http.MethodGet && headerHas(r.Header, "Connection", "upgrade") && headerHas(r.Header, "Upgrade", "websocket")
}

func headerHas(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		if bytes.Contains(bytes.ToLower([]byte(v)), []byte(token)) {
			return true
		}
	}
	return false
}

// responsesWS serves WebSocket mode on GET /v1/responses: each
// response.create event runs as POST /v1/responses with stream true (the
// same admission, rate limits and bounds per response), its events sent
// as WebSocket messages carrying the event's stream_id.
func (s *Server) responsesWS(w http.ResponseWriter, r *http.Request) {
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		return // Accept wrote the error
	}
	conn.SetReadLimit(s.o.MaxBodyBytes)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	sock := &wsSocket{s: s, conn: conn, r: r, owner: clientOf(r).owner(), ctx: ctx,
		lanes: map[string][]json.RawMessage{}, running: map[string]bool{}, convs: map[string][]chatMsg{}, last: time.Now()}
	defer sock.wg.Wait()
	defer cancel() // a closed socket cancels its generations
	sock.wg.Go(func() { sock.keepalive(cancel) })
	for {
		_, data, err := conn.Read(ctx)
		if err != nil {
			status := websocket.CloseStatus(err)
			if status == -1 && ctx.Err() == nil {
				s.o.Logger.Debug("responses websocket closed", zap.Error(err))
			}
			_ = conn.Close(websocket.StatusNormalClosure, "")
			return
		}
		sock.touch()
		sock.receive(data)
	}
}

func (k *wsSocket) touch() {
	k.mu.Lock()
	k.last = time.Now()
	k.mu.Unlock()
}

// keepalive pings the client and closes an idle socket.
func (k *wsSocket) keepalive(cancel context.CancelFunc) {
	t := time.NewTicker(wsPingInterval)
	defer t.Stop()
	for {
		select {
		case <-k.ctx.Done():
			return
		case <-t.C:
		}
		ctx, c := context.WithTimeout(k.ctx, wsPingInterval)
		err := k.conn.Ping(ctx)
		c()
		k.mu.Lock()
		idle := k.active == 0 && k.queued == 0 && time.Since(k.last) > wsIdleTimeout
		k.mu.Unlock()
		if err != nil || idle {
			_ = k.conn.Close(websocket.StatusPolicyViolation, "idle or no pong")
			cancel()
			return
		}
	}
}

// receive takes one client message: a response.create queued on its
// lane, or an error event.
func (k *wsSocket) receive(data []byte) {
	var head struct {
		Type     string  `json:"type"`
		StreamID *string `json:"stream_id"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		k.sendError("", badRequest("", "invalid_json", "The message is not a JSON object."))
		return
	}
	lane := ""
	if head.StreamID != nil {
		lane = *head.StreamID
	}
	if head.Type != "response.create" {
		k.sendError(lane, badRequest("type", "invalid_value", `type must be "response.create", got %q`, head.Type))
		return
	}
	k.mu.Lock()
	if k.queued >= wsMaxQueued {
		k.mu.Unlock()
		k.sendError(lane, overloaded("%d responses wait on this socket, the limit", wsMaxQueued))
		return
	}
	if !k.running[lane] && k.active >= wsMaxConcurrent {
		k.mu.Unlock()
		k.sendError(lane, overloaded("%d responses run on this socket, the limit; send on a running stream_id to queue", wsMaxConcurrent))
		return
	}
	k.lanes[lane] = append(k.lanes[lane], data)
	k.queued++
	start := !k.running[lane]
	if start {
		k.running[lane] = true
		k.active++
	}
	k.mu.Unlock()
	if start {
		k.wg.Go(func() { k.runLane(lane) })
	}
}

// runLane runs lane's events in order until none wait.
func (k *wsSocket) runLane(lane string) {
	for {
		k.mu.Lock()
		q := k.lanes[lane]
		if len(q) == 0 || k.ctx.Err() != nil {
			delete(k.lanes, lane)
			delete(k.running, lane)
			k.queued -= len(q)
			k.active--
			k.last = time.Now()
			k.mu.Unlock()
			return
		}
		data := q[0]
		k.lanes[lane] = q[1:]
		k.queued--
		k.mu.Unlock()
		k.run(lane, data)
	}
}

// run runs one response.create as POST /v1/responses with stream true.
func (k *wsSocket) run(lane string, data []byte) {
	var body map[string]json.RawMessage
	if err := json.Unmarshal(data, &body); err != nil {
		k.sendError(lane, badRequest("", "invalid_json", "The message is not a JSON object."))
		return
	}
	delete(body, "type")
	delete(body, "stream_id")
	body["stream"] = json.RawMessage("true")
	b, _ := json.Marshal(body)
	req := k.r.Clone(k.ctx)
	req.Method = http.MethodPost
	req.Body = io.NopCloser(bytes.NewReader(b))
	req.ContentLength = int64(len(b))
	req.Header = req.Header.Clone()
	req.Header.Set("Content-Type", "application/json")
	for _, h := range []string{"Connection", "Upgrade", "Sec-Websocket-Key", "Sec-Websocket-Version", "Sec-Websocket-Extensions"} {
		req.Header.Del(h)
	}
	rec := &wsRecorder{h: http.Header{}}
	emit := func(typ string, ev map[string]any) error {
		if lane != "" {
			ev["stream_id"] = lane
		}
		return k.write(ev)
	}
	k.s.createResponse(rec, req, emit, k)
	if rec.status != 0 && rec.status != http.StatusOK {
		var e struct {
			Error *apiError `json:"error"`
		}
		if json.Unmarshal(rec.body.Bytes(), &e) == nil && e.Error != nil {
			e.Error.status = rec.status
			k.sendError(lane, e.Error)
		}
	}
}

// write sends one event, within the server's write timeout: a client
// that does not read stops its generations (the error cancels them).
func (k *wsSocket) write(v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	timeout := k.s.o.WriteTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	k.wmu.Lock()
	defer k.wmu.Unlock()
	ctx, cancel := context.WithTimeout(k.ctx, timeout)
	defer cancel()
	if err := k.conn.Write(ctx, websocket.MessageText, data); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			k.s.o.Metrics.StreamStalled()
		}
		return err
	}
	return nil
}

// sendError sends an error event of a response that did not start.
func (k *wsSocket) sendError(lane string, e *apiError) {
	ev := map[string]any{"type": "error", "status": e.status, "error": map[string]any{"code": e.Code, "message": e.Message, "param": e.Param, "type": e.Type}}
	if lane != "" {
		ev["stream_id"] = lane
	}
	_ = k.write(ev)
}

// remember keeps the conversation of a response this socket made, for
// a continuation on the socket (also with store false).
func (k *wsSocket) remember(id string, conv []chatMsg) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.convs[id] = conv
	k.order = append(k.order, id)
	if len(k.order) > wsRemember {
		delete(k.convs, k.order[0])
		k.order = k.order[1:]
	}
}

func (k *wsSocket) conversation(id string) ([]chatMsg, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	c, ok := k.convs[id]
	return c, ok
}

// wsRecorder is the ResponseWriter of a WebSocket's response: events go
// to the socket; an error before them is kept for an error event.
type wsRecorder struct {
	h      http.Header
	status int
	body   bytes.Buffer
}

func (x *wsRecorder) Header() http.Header { return x.h }
func (x *wsRecorder) WriteHeader(code int) {
	if x.status == 0 {
		x.status = code
	}
}
func (x *wsRecorder) Write(p []byte) (int, error) {
	if x.status == 0 {
		x.status = http.StatusOK
	}
	if x.status != http.StatusOK {
		return x.body.Write(p)
	}
	return len(p), nil
}
