package coordinator

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/frontend"
	"github.com/pdserve/pdserve/pkg/grpcnet"
	"github.com/pdserve/pdserve/pkg/region"
)

// StartRegionGateway starts the NATS server of the region's gateway
// (control.StartGateway) when Region has gateway settings, nil
// otherwise: the embedded server connects to it (control.WithLeafRemote),
// and only the region subjects cross it. Its connections to the other
// regions' gateways are mutual TLS with the region certificate. Package
// standalone starts it too. Errors: the region TLS files', the server's.
func (o Options) StartRegionGateway(log *zap.Logger) (*control.Gateway, error) {
	r := o.Region
	if !r.Enabled() || (r.GatewayListen == "" && len(r.Gateways) == 0) {
		return nil, nil
	}
	t, err := r.TLS.Load(grpcnet.TLSServe|grpcnet.TLSDial, nil)
	if err != nil {
		return nil, fmt.Errorf("coordinator: region: %w", err)
	}
	listen := r.GatewayListen
	if listen == "" {
		// Dial only: a listener nobody is told of, on loopback.
		listen = "127.0.0.1:0"
	}
	g, err := control.StartGateway(r.Name, listen, r.Gateways, gatewayTLS(t), t.ClientConfig(), log)
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	return g, nil
}

// gatewayTLS is the configuration of the gateway's connections both ways:
// nats-server solicits the gateways it learns of (from a peer's gossip)
// with it, so it serves and presents the region certificate, and
// verifies peers against the region CA both ways.
func gatewayTLS(t *grpcnet.TLS) *tls.Config {
	cfg := t.ServerConfig()
	cc := t.ClientConfig()
	cfg.RootCAs, cfg.GetClientCertificate = cc.RootCAs, cc.GetClientCertificate
	return cfg
}

// regions is the coordinator's part in a federation of regions: the
// frontend's Regions, the listener peers forward to, the federation's
// summaries and probes.
type regions struct {
	c   *Coordinator
	tc  *tierChooser
	log *zap.Logger

	url string // advertised, as bound
	fed *region.Federation
	fwd *region.Forwarder
	srv *http.Server
	lis net.Listener

	forwards *prometheus.CounterVec
}

// newRegions returns the regions of c, nil without a region.
func newRegions(c *Coordinator, tc *tierChooser) *regions {
	if !c.o.Region.Enabled() {
		return nil
	}
	r := &regions{c: c, tc: tc, log: c.log.Named("region")}
	r.forwards = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pdserve_region_forwards_total",
		Help: "Requests this coordinator forwarded to another region, by region and outcome: served (the region answered), cut (its response failed midway; not retried), unreachable (the region could not take it: the next one, or this region, was tried), spent (region \"\": the request's TTFT budget was spent before a region took it, so this region served it).",
	}, []string{"region", "outcome"})
	c.reg.MustRegister(r.forwards)
	return r
}

// start opens the region listener serving fe to peers, and joins the
// federation on the coordinator's NATS connection.
func (r *regions) start(fe http.Handler) error {
	o := r.c.o.Region
	t, err := o.TLS.Load(grpcnet.TLSServe|grpcnet.TLSDial, r.log.Named("tls"))
	if err != nil {
		return fmt.Errorf("coordinator: region: %w", err)
	}
	u, _ := url.Parse(o.AdvertiseURL) // validated
	host := ""
	if net.ParseIP(u.Hostname()) != nil {
		host = u.Hostname()
	}
	if r.lis, err = net.Listen("tcp", net.JoinHostPort(host, u.Port())); err != nil {
		return fmt.Errorf("coordinator: region listen: %w", err)
	}
	if u.Port() == "0" {
		u.Host = net.JoinHostPort(u.Hostname(), strconv.Itoa(r.lis.Addr().(*net.TCPAddr).Port))
	}
	r.url = u.String()
	r.srv = &http.Server{
		Handler: r.peerHandler(fe), ReadHeaderTimeout: r.c.o.HTTPReadHeaderTimeout, IdleTimeout: 2 * time.Minute,
		TLSConfig: region.ServerTLS(t), ErrorLog: zap.NewStdLog(r.log.Named("http")),
	}
	r.fwd = region.NewForwarder(o.Name, t, r.log)
	r.c.wg.Go(func() {
		if err := r.srv.ServeTLS(r.lis, "", ""); !errors.Is(err, http.ErrServerClosed) {
			r.c.serveErr <- fmt.Errorf("coordinator: region listener: %w", err)
		}
	})
	if r.fed, err = region.Start(r.c.nc, region.Config{Name: o.Name, Local: r.summary, Interval: r.c.o.RegionInterval, TTL: r.ttl(), Logger: r.log}); err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	r.c.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "pdserve_region_peers",
		Help: "Other regions this coordinator heard from within the federation's TTL.",
	}, func() float64 { return float64(len(r.fed.Peers())) }))
	r.log.Info("region federation started", zap.String("region", o.Name), zap.String("url", r.url))
	return nil
}

// shutdown stops serving peers (requests in flight finish within ctx) and
// leaves the federation.
func (r *regions) shutdown(ctx context.Context) {
	if r.srv != nil {
		if err := r.srv.Shutdown(ctx); err != nil {
			_ = r.srv.Close()
		}
	}
	if r.fed != nil {
		r.fed.Stop()
	}
	if r.fwd != nil {
		r.fwd.Close()
	}
}

// summary is this region's summary now.
func (r *regions) summary() region.Summary {
	s := region.Summary{URL: r.url}
	if pt := r.c.o.Policy.Tiers; len(pt) > 0 {
		s.Tiers = make(map[string][]string, len(pt))
		for k := range maps.Keys(pt) {
			s.Tiers[k] = pt[k].Models
		}
	}
	for _, m := range r.c.Models() {
		ms := region.ModelSummary{Name: m.Name, Live: r.tc.live(m.Name)}
		if t, ok := r.tc.chooser.Terms(m.Name); ok {
			ms.Terms = &t
		}
		s.Models = append(s.Models, ms)
	}
	return s
}

// Forward implements frontend.Regions.
func (r *regions) Forward(w http.ResponseWriter, req *http.Request, body []byte, f frontend.Forwardable) frontend.Forwarded {
	var local region.Local
	if f.Served != "" {
		l := r.tc.live(f.Served)
		p := r.tc.chooser.Predict(f.Served, f.PromptTokens, l)
		local = region.Local{Up: l.Up && !l.Shedding, Predicted: p.TTFT(), Measured: p.Measured}
	}
	rq := region.Request{
		Path: f.Route, Key: f.Key, Tenant: f.Tenant, TTFTBudget: f.Objective.TTFTBudget, Priority: f.Objective.Priority, Header: req.Header,
		Network: f.ClientRTT, Arrival: f.Arrival, OnUsage: f.Settle,
		// A request this region cannot serve goes elsewhere however late.
		Fallback: !local.Up,
	}
	// Placed against what is left of the budget: the client's network
	// term and the time spent here are gone. A budget already spent is
	// met nowhere: served here, without a round trip more, while this
	// region can; else placed only by availability.
	left := f.Objective.TTFTBudget
	if left > 0 {
		if left = rq.Left(time.Now(), 0); left <= 0 {
			if local.Up {
				r.forwards.WithLabelValues("", "spent").Inc()
				return frontend.Forwarded{}
			}
			left = 0
		}
	}
	order := region.Place(local, left, region.Candidates(r.fed.Peers(), f.Model, f.PromptTokens))
	if len(order) == 0 {
		return frontend.Forwarded{}
	}
	out := r.fwd.Forward(req.Context(), w, body, rq, order)
	if out.Spent {
		r.forwards.WithLabelValues("", "spent").Inc()
	}
	for _, t := range out.Tried {
		name, why, _ := strings.Cut(t, ":")
		if strings.HasSuffix(why, "budget spent") {
			continue // counted above
		}
		r.forwards.WithLabelValues(name, "unreachable").Inc()
	}
	if out.Region == "" {
		if len(out.Tried) > 0 {
			r.log.Warn("no region took the request; serving it here", zap.Strings("tried", out.Tried), zap.Bool("local_up", local.Up))
		}
		return frontend.Forwarded{}
	}
	outcome := "served"
	if out.Err != nil && req.Context().Err() == nil {
		outcome = "cut"
	}
	r.forwards.WithLabelValues(out.Region, outcome).Inc()
	fw := frontend.Forwarded{Region: out.Region, Origin: r.c.o.Region.Name, Status: out.Status, Err: out.Err}
	for _, c := range order {
		if c.Region == out.Region {
			fw.RTT = c.RTT
		}
	}
	return fw
}

// peerHandler serves the requests peers forward: only the completion
// routes, only as forwarded once, with the identity the origin sent
// (the listener's mutual TLS has verified the peer against the region CA).
func (r *regions) peerHandler(fe http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.TLS == nil || len(req.TLS.VerifiedChains) == 0 {
			http.Error(w, "forbidden: region peers only", http.StatusForbidden)
			return
		}
		if req.URL.Path != frontend.RouteChat && req.URL.Path != frontend.RouteCompletions {
			peerError(w, http.StatusNotFound, "not_found_error", "", "peers forward only "+frontend.RouteChat+" and "+frontend.RouteCompletions)
			return
		}
		h := req.Header
		if hop, err := strconv.Atoi(h.Get(region.HeaderHop)); err != nil || hop < 1 || hop > region.MaxHops {
			peerError(w, http.StatusBadRequest, "invalid_request_error", "hop_limit", fmt.Sprintf("%s must be 1..%d", region.HeaderHop, region.MaxHops))
			return
		}
		fw := frontend.Forwarded{Origin: h.Get(region.HeaderOrigin), Key: h.Get(region.HeaderKey), Tenant: h.Get(region.HeaderTenant)}
		if err := control.ValidToken(fw.Origin); err != nil {
			peerError(w, http.StatusBadRequest, "invalid_request_error", "invalid_value", region.HeaderOrigin+" must name the origin region")
			return
		}
		if v := h.Get(region.HeaderRTT); v != "" {
			ms, err := strconv.ParseFloat(v, 64)
			if err != nil || !(ms >= 0) || ms > 60e3 {
				peerError(w, http.StatusBadRequest, "invalid_request_error", "invalid_value", region.HeaderRTT+" must be milliseconds in [0, 60000]")
				return
			}
			fw.RTT = time.Duration(ms * float64(time.Millisecond))
		}
		// The tokens the request used, sent as a trailer: the origin,
		// which charged the key, settles to it; nothing is charged here.
		used := -1
		fw.Usage = func(n int) { used = n }
		fe.ServeHTTP(w, req.WithContext(frontend.WithForwarded(req.Context(), fw)))
		if used >= 0 {
			w.Header().Set(http.TrailerPrefix+region.HeaderUsage, strconv.Itoa(used))
		}
	})
}

func peerError(w http.ResponseWriter, status int, typ, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	c := "null"
	if code != "" {
		c = strconv.Quote(code)
	}
	_, _ = fmt.Fprintf(w, `{"error":{"message":%s,"type":%q,"param":null,"code":%s}}`+"\n", strconv.Quote(msg), typ, c)
}

// RegionURL returns where peers forward to this region, "" without one.
func (c *Coordinator) RegionURL() string {
	if c.regions == nil {
		return ""
	}
	return c.regions.url
}

// minRegionTTL is the least time a region stays known without a summary:
// a loaded coordinator or a slow link delays summaries by more than a few
// short intervals. A region gone within it is passed over at once when
// forwarding (its listener refuses).
const minRegionTTL = 2 * time.Second

// ttl is how long a region stays known without a summary: three
// intervals, at least minRegionTTL.
func (r *regions) ttl() time.Duration {
	iv := r.c.o.RegionInterval
	if iv <= 0 {
		iv = time.Second
	}
	return max(3*iv, minRegionTTL)
}
