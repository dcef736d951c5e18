package charttest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/engine/ref"
	"github.com/pdserve/pdserve/pkg/enginecfg"
	"github.com/pdserve/pdserve/pkg/kv/codec"
	"github.com/pdserve/pdserve/pkg/kvtransfer/codecpick"
)

// TestSchemaEnums: the values schema offers exactly the codecs, ref
// presets and engines the binaries know, so that it neither rejects a valid choice nor
// lets an unknown one through to a crash-looping pod.
func TestSchemaEnums(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Definitions struct {
			Codec struct {
				Enum []string `json:"enum"`
			} `json:"codec"`
			EngineFields struct {
				Properties struct {
					Type struct {
						Enum []string `json:"enum"`
					} `json:"type"`
					Preset struct {
						Enum []string `json:"enum"`
					} `json:"preset"`
				} `json:"properties"`
			} `json:"engineFields"`
		} `json:"definitions"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		schema     []string
		binaryKnow []string
	}{
		{"codec", schema.Definitions.Codec.Enum, append(codec.Names(), codecpick.Auto, codecpick.AutoLossy)},
		{"preset", schema.Definitions.EngineFields.Properties.Preset.Enum, ref.Presets()},
		{"engine", schema.Definitions.EngineFields.Properties.Type.Enum, []string{enginecfg.Ref, enginecfg.Sim, enginecfg.Llama}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, want := slices.Sorted(slices.Values(tc.schema)), slices.Sorted(slices.Values(tc.binaryKnow))
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("schema enum (-binaries +schema):\n%s", diff)
			}
		})
	}
}

// TestSchemaPolicyMatchesConfig: coordinator.policy in the schema has the
// fields of pkg/config's Policy (by YAML name, two levels deep), except
// prompt_budgets.api_keys, which the chart keeps out of the ConfigMap
// (apiKeys), and auth.*, whose files the chart mounts from the Secrets of
// auth.apiKeysSecret and auth.metricsTokenSecret and passes as flags. A
// field added to the policy file shows up here.
func TestSchemaPolicyMatchesConfig(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	type node struct {
		Properties           map[string]node `json:"properties"`
		AdditionalProperties any             `json:"additionalProperties"`
	}
	var schema struct {
		Properties struct {
			Coordinator struct {
				Properties struct {
					Policy node `json:"policy"`
				} `json:"properties"`
			} `json:"coordinator"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	var got []string
	for k, v := range schema.Properties.Coordinator.Properties.Policy.Properties {
		for kk := range v.Properties {
			got = append(got, k+"."+kk)
		}
		if _, ok := v.AdditionalProperties.(map[string]any); ok && len(v.Properties) == 0 {
			got = append(got, k+".*") // a map of named entries (tiers)
		}
	}
	var want []string
	pt := reflect.TypeFor[config.Policy]()
	for i := range pt.NumField() {
		f := pt.Field(i)
		st := f.Type
		if st.Kind() == reflect.Map {
			want = append(want, yamlName(f)+".*")
			continue
		}
		for j := range st.NumField() {
			name := yamlName(f) + "." + yamlName(st.Field(j))
			if name != "prompt_budgets.api_keys" && !strings.HasPrefix(name, "auth.") {
				want = append(want, name)
			}
		}
	}
	if len(want) == 0 {
		t.Fatal("found no fields in config.Policy")
	}
	slices.Sort(got)
	slices.Sort(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("schema coordinator.policy fields (-pkg/config +schema):\n%s", diff)
	}
}

func yamlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if name == "" {
		return strings.ToLower(f.Name)
	}
	return name
}
