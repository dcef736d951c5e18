package router_test

import (
	"testing"

	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/router"
)

// The policy's default weights are the router's: an empty routing
// section routes as router.Config{} does.
func TestPolicyDefaultsAreTheRouters(t *testing.T) {
	rt := config.Default().Routing
	if got := router.Weights(rt.DecodeWeights()); got != router.DefaultDecodeWeights {
		t.Errorf("policy decode weights %+v, router's %+v", got, router.DefaultDecodeWeights)
	}
	if got := router.Weights(rt.PrefillWeights()); got != router.DefaultPrefillWeights {
		t.Errorf("policy prefill weights %+v, router's %+v", got, router.DefaultPrefillWeights)
	}
}
