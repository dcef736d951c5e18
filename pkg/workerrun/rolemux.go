package workerrun

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
)

// roleServices are the gRPC services a role's server registers; an
// elastic worker serves all of them for its whole life, since a
// grpc.Server takes no registration once it serves.
var roleServices = []*grpc.ServiceDesc{
	&pdservev1.PrefillService_ServiceDesc,
	&pdservev1.DecodeService_ServiceDesc,
	&pdservev1.KVTransferService_ServiceDesc,
}

// roleMux serves an elastic worker's role services on one grpc.Server and
// hands each call to the implementation of the role the worker has now.
// A call of a service the current role does not serve (or one while the
// worker changes role) fails with UNAVAILABLE, which the coordinator
// retries on another worker. A role's server registers its services on
// a roleSet (a grpc.ServiceRegistrar), which the mux then serves at once.
type roleMux struct {
	mu  sync.RWMutex
	set *roleSet // nil: no role serves (between two roles)
	// first is called once per set, on the set's first call.
	first func(*roleSet)
}

// roleSet is the implementations of one role's services.
type roleSet struct {
	role  string
	impls map[string]any // by service name
	once  sync.Once
}

func newRoleSet(role string) *roleSet { return &roleSet{role: role, impls: map[string]any{}} }

// RegisterService implements grpc.ServiceRegistrar.
func (s *roleSet) RegisterService(sd *grpc.ServiceDesc, impl any) { s.impls[sd.ServiceName] = impl }

// install registers roleServices on g, each dispatching through m.
func (m *roleMux) install(g *grpc.Server) {
	for _, sd := range roleServices {
		d := *sd
		d.HandlerType = nil // impl nil: grpc checks no interface
		d.Methods = make([]grpc.MethodDesc, len(sd.Methods))
		for i, md := range sd.Methods {
			h := md.Handler
			d.Methods[i] = grpc.MethodDesc{MethodName: md.MethodName, Handler: func(_ any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
				impl, err := m.impl(d.ServiceName)
				if err != nil {
					return nil, err
				}
				return h(impl, ctx, dec, ic)
			}}
		}
		d.Streams = make([]grpc.StreamDesc, len(sd.Streams))
		for i, st := range sd.Streams {
			h := st.Handler
			d.Streams[i] = st
			d.Streams[i].Handler = func(_ any, stream grpc.ServerStream) error {
				impl, err := m.impl(d.ServiceName)
				if err != nil {
					return err
				}
				return h(impl, stream)
			}
		}
		g.RegisterService(&d, nil)
	}
}

// impl returns the current role's implementation of service.
func (m *roleMux) impl(service string) (any, error) {
	m.mu.RLock()
	set := m.set
	m.mu.RUnlock()
	if set == nil {
		return nil, status.Error(codes.Unavailable, "worker is changing role")
	}
	impl, ok := set.impls[service]
	if !ok {
		return nil, status.Errorf(codes.Unavailable, "worker is a %s worker now: it does not serve %s", set.role, service)
	}
	if m.first != nil {
		set.once.Do(func() { m.first(set) })
	}
	return impl, nil
}

// serve makes set (nil: none) the role served from now on.
func (m *roleMux) serve(set *roleSet) {
	m.mu.Lock()
	m.set = set
	m.mu.Unlock()
}
