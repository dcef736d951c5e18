package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
)

// Command kinds.
const (
	CmdDrain  = "drain"  // stop taking new requests, finish the running ones
	CmdCancel = "cancel" // cancel RequestID and free its KV
	CmdResend = "resend" // re-send RequestID's retained KV to the decode worker at Arg
	// CmdRole moves the worker to the role in Arg (prefill, decode or
	// colocated): it drains its current role and starts the new one with
	// its engine still loaded. Only workers started elastic take it, and
	// only with a NATS user of RoleElastic.
	CmdRole = "role"
)

// Command is an order to one worker, sent on "pdserve.cmd.<role>.<id>".
type Command struct {
	Kind      string `json:"kind"`                 // CmdDrain, CmdCancel, CmdResend, ...; not empty
	RequestID string `json:"request_id,omitempty"` // the request it concerns, if any
	Arg       string `json:"arg,omitempty"`        // kind-specific argument
	// Migrate, on a CmdRole to a worker leaving decode or colocated,
	// moves its running sequences with their KV to other decode workers
	// (decode.Server.MigrateAll) instead of finishing them before the
	// change. The sender sets it only when another decode worker can take
	// them (the planner never moves a role's last worker).
	Migrate bool `json:"migrate,omitempty"`
}

// CommandReply is a worker's answer to a Command.
type CommandReply struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"` // the handler's error when not OK
}

// SendCommand sends c to the worker of role and workerID (a heartbeat's
// Role and ID) and waits for its reply, at most until ctx ends (give ctx a
// deadline). Only the coordinator role may publish commands on an
// authenticated server. Errors: ErrBadToken (role or worker id), ErrBadCommand
// (empty kind, or a reply that is not a CommandReply), ErrNoWorker (nobody
// subscribed), ErrCommandFailed (the handler failed; its text follows), ctx
// errors, or nats errors, all wrapped.
func SendCommand(ctx context.Context, nc *nats.Conn, role, workerID string, c Command) error {
	if err := ValidToken(workerID); err != nil {
		return fmt.Errorf("control: command to worker: %w", err)
	}
	if err := ValidToken(role); err != nil {
		return fmt.Errorf("control: command to worker %s: role: %w", workerID, err)
	}
	if c.Kind == "" {
		return fmt.Errorf("control: command to %s: %w: empty kind", workerID, ErrBadCommand)
	}
	data, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("control: command %s to %s: %w", c.Kind, workerID, err)
	}
	msg, err := nc.RequestWithContext(ctx, CommandSubject(role, workerID), data)
	if errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("control: command %s to %s: %w (%w)", c.Kind, workerID, ErrNoWorker, err)
	}
	if err != nil {
		return fmt.Errorf("control: command %s to %s: %w", c.Kind, workerID, err)
	}
	var r CommandReply
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		return fmt.Errorf("control: command %s to %s: %w: reply: %w", c.Kind, workerID, ErrBadCommand, err)
	}
	if !r.OK {
		return fmt.Errorf("control: command %s to %s: %w: %s", c.Kind, workerID, ErrCommandFailed, r.Error)
	}
	return nil
}

// HandleCommands subscribes to the command subject of the worker of role
// and workerID and answers every command with h's outcome (a
// CommandReply). h runs on the subscription's goroutine, one command at a
// time; it should return quickly (start long work, like a drain, in the
// background). A request that is not a Command gets an error reply without
// calling h. When nc is connected, the subscription is registered with the
// server when HandleCommands returns; when nc is still (re)connecting, it
// is registered once nc connects. Unsubscribe (or Drain) it to stop.
// Errors: ErrBadToken, nats errors (a permission violation arrives
// asynchronously, at nc's error handler), wrapped.
func HandleCommands(nc *nats.Conn, role, workerID string, h func(Command) error) (*nats.Subscription, error) {
	if err := ValidToken(workerID); err != nil {
		return nil, fmt.Errorf("control: handle commands: %w", err)
	}
	if err := ValidToken(role); err != nil {
		return nil, fmt.Errorf("control: handle commands for %s: role: %w", workerID, err)
	}
	sub, err := nc.Subscribe(CommandSubject(role, workerID), func(msg *nats.Msg) {
		var c Command
		var r CommandReply
		if err := json.Unmarshal(msg.Data, &c); err != nil || c.Kind == "" {
			r.Error = fmt.Sprintf("%v: not a command", ErrBadCommand)
		} else if err := h(c); err != nil {
			r.Error = err.Error()
		} else {
			r.OK = true
		}
		data, _ := json.Marshal(r) // a CommandReply always marshals
		// A failed reply (connection gone) reaches the sender as its
		// timeout; there is nobody else to tell.
		_ = msg.Respond(data)
	})
	if err != nil {
		return nil, fmt.Errorf("control: handle commands for %s: %w", workerID, err)
	}
	if !nc.IsConnected() {
		return sub, nil
	}
	if err := nc.FlushTimeout(flushTimeout); err != nil && nc.IsConnected() {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("control: handle commands for %s: %w", workerID, err)
	}
	return sub, nil
}
