package control

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"go.yaml.in/yaml/v3"

	"github.com/pdserve/pdserve/pkg/respstore"
)

// Roles that name NATS permissions only; they are not worker roles and
// never appear in heartbeats.
const (
	// RoleCoordinator publishes commands and plans and reads heartbeats.
	RoleCoordinator Role = "coordinator"
	// RoleObserver reads heartbeats and plans and publishes nothing
	// (dashboards, `nats sub`).
	RoleObserver Role = "observer"
	// RoleElastic is a worker that may change role at run time
	// (CmdRole): it has the permissions of prefill, decode and colocated
	// workers for its id.
	RoleElastic Role = "elastic"
)

// inboxWildcard is where nats.go's request/reply replies arrive.
const inboxWildcard = "_INBOX.>"

// commandReplyTTL bounds how long a worker may answer a command it
// received (nats-server's allow_responses).
const commandReplyTTL = time.Minute

// NATSUser is one user of the embedded NATS server, with the permissions
// of its role. Either User and Password, or NKey.
type NATSUser struct {
	// User is the user name.
	User string `yaml:"user,omitempty"`
	// Password is the password in plain text or as a bcrypt hash
	// ("$2a$..." as nats-server takes it, e.g. from `nats server
	// passwd`); with a hash, the users file holds no usable secret.
	Password string `yaml:"password,omitempty"`
	// NKey is the user's public NKey ("U..."), instead of User and
	// Password; the client holds the seed (--nats-nkey-seed-file).
	NKey string `yaml:"nkey,omitempty"`
	// Role is coordinator, observer, prefill, decode, colocated or
	// elastic (a worker that may take each of the three worker roles).
	Role Role `yaml:"role"`
	// ID is the one worker id this user may publish heartbeats as and
	// take commands for. Empty for a worker role: any id of the role (a
	// credential the role's replicas share; see the package doc for what
	// that does not prevent). Must be empty for coordinator and observer.
	ID string `yaml:"id,omitempty"`
}

// Name returns the user name or, for an NKey user, the public key.
func (u NATSUser) Name() string {
	if u.NKey != "" {
		return u.NKey
	}
	return u.User
}

// ConnOptions returns the client options that log in as u: user and
// password in memory (for users made by NewNATSUser, in process). An NKey
// user's seed is not known here: the zero ConnOptions.
func (u NATSUser) ConnOptions() ConnOptions {
	if u.NKey != "" {
		return ConnOptions{}
	}
	return ConnOptions{User: u.User, Password: u.Password}
}

// NewNATSUser returns a user of role (and worker id, or "") with a
// generated name and a random 256-bit password from crypto/rand, for
// credentials made per start and kept in process.
func NewNATSUser(role Role, id string) NATSUser {
	name := "pdserve-" + string(role)
	if id != "" {
		name += "-" + id
	}
	return NATSUser{User: name + "-" + randomHex(4), Password: randomHex(32), Role: role, ID: id}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}

// Permissions returns the NATS permissions of role, for worker id (""
// for a user every worker of the role shares):
//
//	coordinator  publish pdserve.cmd.>, pdserve.plan
//	             subscribe pdserve.hb.>, pdserve.kv.>, pdserve.plan, _INBOX.>
//	observer     publish nothing; subscribe pdserve.hb.>, pdserve.plan
//	<worker>     publish pdserve.hb.<role>.<id>, pdserve.kv.<role>.<id>,
//	             pdserve.kv.<role>.<id>.host (the host tier's events);
//	             subscribe pdserve.cmd.<role>.<id>;
//	             reply once to each command received, within a minute
//	prefill      also subscribe pdserve.hb.decode.*, pdserve.hb.colocated.*
//	elastic      the union of prefill's, decode's and colocated's, for its id
//
// where <id> is "*" for a shared user. A prefill worker reads the
// heartbeats of the workers it sends KV to for their codec speeds (the
// adaptive codec); it reads no other role's, and publishes nothing more. Errors: ErrBadToken (id), an
// unknown role, an id for coordinator or observer, wrapped.
func Permissions(role Role, id string) (*server.Permissions, error) {
	if id != "" {
		if err := ValidToken(id); err != nil {
			return nil, fmt.Errorf("control: permissions of %s: id: %w", role, err)
		}
	}
	switch role {
	case RoleCoordinator, RoleObserver:
		if id != "" {
			return nil, fmt.Errorf("control: permissions of %s: a worker id (%s) applies only to worker roles", role, id)
		}
		if role == RoleObserver {
			return &server.Permissions{
				Publish:   &server.SubjectPermission{Deny: []string{">"}},
				Subscribe: &server.SubjectPermission{Allow: []string{HeartbeatWildcard, PlanSubject}},
			}, nil
		}
		return &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: append([]string{commandPrefix + ">", PlanSubject, RegionWildcard}, respstore.Subjects()...)},
			Subscribe: &server.SubjectPermission{Allow: []string{HeartbeatWildcard, KVWildcard, PlanSubject, inboxWildcard, RegionWildcard}},
		}, nil
	case RolePrefill, RoleDecode, RoleColocated:
		tok := id
		if tok == "" {
			tok = "*"
		}
		sub := []string{CommandSubject(string(role), tok)}
		if role == RolePrefill {
			sub = append(sub, HeartbeatSubject(string(RoleDecode), "*"), HeartbeatSubject(string(RoleColocated), "*"))
		}
		return &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{HeartbeatSubject(string(role), tok), KVSubject(string(role), tok), KVTierSubject(string(role), tok, KVTierHost), KVTierSubject(string(role), tok, KVTierDisk)}},
			Subscribe: &server.SubjectPermission{Allow: sub},
			Response:  &server.ResponsePermission{MaxMsgs: 1, Expires: commandReplyTTL},
		}, nil
	case RoleElastic:
		p := &server.Permissions{
			Publish:   &server.SubjectPermission{},
			Subscribe: &server.SubjectPermission{},
			Response:  &server.ResponsePermission{MaxMsgs: 1, Expires: commandReplyTTL},
		}
		for _, r := range []Role{RolePrefill, RoleDecode, RoleColocated} {
			rp, err := Permissions(r, id)
			if err != nil {
				return nil, err
			}
			p.Publish.Allow = append(p.Publish.Allow, rp.Publish.Allow...)
			for _, s := range rp.Subscribe.Allow {
				if !slices.Contains(p.Subscribe.Allow, s) {
					p.Subscribe.Allow = append(p.Subscribe.Allow, s)
				}
			}
		}
		return p, nil
	}
	return nil, fmt.Errorf("control: unknown NATS role %q (want coordinator, observer, prefill, decode, colocated or elastic)", role)
}

// ValidateUsers reports every invalid user in one error: neither or both
// of user/password and nkey, an empty password, a malformed public NKey,
// an unknown role, a bad id, a name given twice.
func ValidateUsers(users []NATSUser) error {
	var errs []error
	seen := map[string]bool{}
	for i, u := range users {
		bad := func(format string, a ...any) {
			errs = append(errs, fmt.Errorf("user %d (%s): %s", i+1, u.Name(), fmt.Sprintf(format, a...)))
		}
		switch {
		case u.NKey != "" && (u.User != "" || u.Password != ""):
			bad("give user and password, or nkey, not both")
		case u.NKey != "":
			if len(u.NKey) != 56 || !strings.HasPrefix(u.NKey, "U") {
				bad("nkey must be a public user NKey (56 characters starting with U)")
			}
		case u.User == "":
			bad("user (or nkey) is required")
		case u.Password == "":
			bad("password is required")
		}
		if seen[u.Name()] {
			bad("listed twice")
		}
		seen[u.Name()] = true
		if _, err := Permissions(u.Role, u.ID); err != nil {
			bad("%v", err)
		}
	}
	return errors.Join(errs...)
}

// usersFile is the layout of LoadUsers' file.
type usersFile struct {
	Users []NATSUser `yaml:"users"`
}

// LoadUsers reads the embedded NATS server's users from a YAML file:
//
//	users:
//	  - {user: coordinator, password: "$2a$11$...", role: coordinator}
//	  - {user: decode, password: "...", role: decode}          # shared by the decode replicas
//	  - {user: prefill-0, password: "...", role: prefill, id: prefill-0}
//	  - {nkey: UAT6BWCSCWLUKJT6K6MBJJOEOTXZ5AJDOYKNEVRFC7VNO6OA43N4TRNO, role: observer}
//
// Unknown fields are refused. Errors: the file's read or YAML errors, no
// users, ValidateUsers' errors, wrapped with the path.
func LoadUsers(path string) ([]NATSUser, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("control: nats users: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f usersFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("control: nats users %s: %w", path, err)
	}
	if len(f.Users) == 0 {
		return nil, fmt.Errorf("control: nats users %s: no users", path)
	}
	if err := ValidateUsers(f.Users); err != nil {
		return nil, fmt.Errorf("control: nats users %s: %w", path, err)
	}
	return f.Users, nil
}

// serverUsers converts users to nats-server's users and NKey users.
func serverUsers(users []NATSUser) ([]*server.User, []*server.NkeyUser, error) {
	if err := ValidateUsers(users); err != nil {
		return nil, nil, err
	}
	var us []*server.User
	var nks []*server.NkeyUser
	for _, u := range users {
		p, _ := Permissions(u.Role, u.ID) // checked by ValidateUsers
		if u.NKey != "" {
			nks = append(nks, &server.NkeyUser{Nkey: u.NKey, Permissions: p})
			continue
		}
		us = append(us, &server.User{Username: u.User, Password: u.Password, Permissions: p})
	}
	return us, nks, nil
}
