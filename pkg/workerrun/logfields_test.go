package workerrun

import (
	"flag"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap/zapcore"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/pkg/enginecfg"
)

// TestLogFieldsCoverFlags: the "effective configuration" line of each
// worker role names every flag the role registers (the flag's name with
// underscores), so that a setting in force is never invisible in the log;
// an engine's flags are named when that engine runs.
func TestLogFieldsCoverFlags(t *testing.T) {
	for name, o := range map[string]Options{"prefill": NewPrefillOptions(), "decode": NewDecodeOptions()} {
		t.Run(name, func(t *testing.T) {
			fs := flag.NewFlagSet(name, flag.ContinueOnError)
			o.AddFlags(fs)
			enc := zapcore.NewMapObjectEncoder()
			for _, e := range []string{enginecfg.Ref, enginecfg.Sim, enginecfg.Llama} {
				o.Engine.Engine = e
				for _, f := range o.LogFields() {
					f.AddTo(enc)
				}
			}
			var missing []string
			fs.VisitAll(func(f *flag.Flag) {
				if _, renamed := cliflags.CurrentName(fs, f.Name); renamed {
					return // a former name: its flag's field names the setting
				}
				if _, ok := enc.Fields[strings.ReplaceAll(f.Name, "-", "_")]; !ok {
					missing = append(missing, f.Name)
				}
			})
			slices.Sort(missing)
			if len(missing) > 0 {
				t.Errorf("flags not in the effective configuration: --%s", strings.Join(missing, ", --"))
			}
		})
	}
}
