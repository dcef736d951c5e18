package region

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/tiers"
)

const ms = time.Millisecond

func regions(cs []Candidate) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Region)
	}
	return out
}

// Place serves here while this region fits the budget (or is unmeasured,
// or there is no budget), else the peers that fit, cheapest first
// (prediction plus RTT); with none fitting, the best peer only if it
// beats this region; a region down here takes any peer.
func TestPlace(t *testing.T) {
	b := Candidate{Region: "b", Predicted: 50 * ms, RTT: 90 * ms, Measured: true} // 140
	c := Candidate{Region: "c", Predicted: 20 * ms, RTT: 20 * ms, Measured: true} // 40
	d := Candidate{Region: "d", Predicted: 400 * ms, RTT: 5 * ms, Measured: true} // 405
	all := []Candidate{b, c, d}
	cases := []struct {
		name   string
		local  Local
		budget time.Duration
		want   []string
	}{
		{"fits here", Local{Up: true, Predicted: 90 * ms, Measured: true}, 100 * ms, nil},
		{"no budget", Local{Up: true, Predicted: 900 * ms, Measured: true}, 0, nil},
		{"unmeasured here", Local{Up: true}, 100 * ms, nil},
		{"over here: fitting peers, cheapest first", Local{Up: true, Predicted: 300 * ms, Measured: true}, 150 * ms, []string{"c", "b"}},
		{"none fits: the best if it beats here", Local{Up: true, Predicted: 300 * ms, Measured: true}, 30 * ms, []string{"c"}},
		{"none fits and here is best", Local{Up: true, Predicted: 35 * ms, Measured: true}, 30 * ms, nil},
		{"down here: every peer, fitting first", Local{}, 30 * ms, []string{"c", "b", "d"}},
		{"down here, budget fits some", Local{}, 150 * ms, []string{"c", "b"}},
	}
	for _, tc := range cases {
		if got := regions(Place(tc.local, tc.budget, all)); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if got := Place(Local{}, 0, nil); got != nil {
		t.Errorf("down, no peers: %v", got)
	}
}

// Candidates takes the peers that serve the model now (up, not
// shedding; a tier alias by its best model; "" by the default model),
// each predicted from its published terms for this prompt.
func TestCandidates(t *testing.T) {
	terms := &tiers.Terms{PrefillSecPerToken: 0.001, RestSec: 0.01}
	peers := []Peer{
		{Summary: Summary{Region: "b", URL: "https://b:1", Models: []ModelSummary{
			{Name: "m", Live: tiers.Live{Up: true, QueuedPrefillTokens: 100}, Terms: terms},
		}}, RTT: 30 * ms},
		{Summary: Summary{Region: "c", URL: "https://c:1", Models: []ModelSummary{
			{Name: "m", Live: tiers.Live{Up: true, Shedding: true}, Terms: terms},
			{Name: "fast", Live: tiers.Live{Up: true}},
		}, Tiers: map[string][]string{"chat": {"m", "fast"}}}, RTT: 10 * ms},
		{Summary: Summary{Region: "d", URL: "https://d:1", Models: []ModelSummary{{Name: "m"}}}},
		{Summary: Summary{Region: "e", Models: []ModelSummary{{Name: "m", Live: tiers.Live{Up: true}}}}}, // no URL
	}
	got := Candidates(peers, "m", 200)
	if len(got) != 1 || got[0].Region != "b" || got[0].Predicted != 310*ms || got[0].Cost() != 340*ms || !got[0].Measured {
		t.Errorf("model m: %+v; want b only (c sheds, d is down, e has no URL), predicted (100+200) × 1 ms + 10 ms", got)
	}
	if got := regions(Candidates(peers, "chat", 200)); !reflect.DeepEqual(got, []string{"c"}) {
		t.Errorf("tier chat: %v, want c by its model fast", got)
	}
	if got := regions(Candidates(peers, "", 200)); !reflect.DeepEqual(got, []string{"b"}) {
		t.Errorf("default model: %v, want b (c's default m sheds)", got)
	}
}

// The gateway flag takes NAME=nats://HOST:PORT, repeatable, and refuses
// anything else, naming what it wants.
func TestGatewaysFlag(t *testing.T) {
	var g Gateways
	for _, v := range []string{"eu=nats://10.0.0.1:7222", "eu=nats://10.0.0.2:7222", "us=nats://gw.us:7222"} {
		if err := g.Set(v); err != nil {
			t.Fatalf("%s: %v", v, err)
		}
	}
	if got := g.String(); got != "eu=nats://10.0.0.1:7222,eu=nats://10.0.0.2:7222,us=nats://gw.us:7222" {
		t.Errorf("String() = %q", got)
	}
	for _, v := range []string{"nats://h:1", "e.u=nats://h:1", "eu=http://h:1", "eu=nats://h", "eu=nats://u:p@h:1", "eu=nats://h:1/x"} {
		if err := g.Set(v); err == nil {
			t.Errorf("%q accepted", v)
		}
	}
}

// Options: zero is no region; a region needs its advertised https URL
// and the three TLS files; settings without --region are refused.
func TestOptionsValidate(t *testing.T) {
	if err := (Options{}).Validate(); err != nil {
		t.Errorf("zero: %v", err)
	}
	if err := (Options{GatewayListen: "0.0.0.0:7222"}).Validate(); err == nil || !strings.Contains(err.Error(), "need --region") {
		t.Errorf("gateway without region: %v", err)
	}
	err := (Options{Name: "eu", AdvertiseURL: "http://x:1"}).Validate()
	if err == nil || !strings.Contains(err.Error(), "--region-advertise-url") || !strings.Contains(err.Error(), "--region-tls-cert") {
		t.Errorf("http URL, no TLS: %v", err)
	}
	o := Options{Name: "eu", AdvertiseURL: "https://10.1.2.3:8443"}
	if a, err := o.listenAddr(); err != nil || a != "10.1.2.3:8443" {
		t.Errorf("listen of an IP URL: %q, %v", a, err)
	}
	o.AdvertiseURL = "https://coord.eu.example:8443"
	if a, err := o.listenAddr(); err != nil || a != ":8443" {
		t.Errorf("listen of a host name URL: %q, %v", a, err)
	}
}
