package coordinator

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/pdserve/pdserve/pkg/apikey"
	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/metrics"
)

// AuthOptions authenticate the clients of the API (package apikey).
type AuthOptions struct {
	// APIKeysFile (--api-keys) and MetricsTokenFile (--metrics-token-file)
	// override the policy's auth.api_keys_file and auth.metrics_token_file
	// when set; Complete puts the effective paths into Policy.Auth.
	APIKeysFile, MetricsTokenFile string
	// ReloadInterval is how often the files are checked for changes
	// (their modification time and size, then their content); 0: only on
	// ReloadSignals.
	ReloadInterval time.Duration
	// ReloadSignals, when not nil, reloads both files on each value
	// received. coordinatorrun.Main sends SIGHUP there when a file is configured. Not a
	// flag.
	ReloadSignals <-chan os.Signal
}

// DefaultAuthReloadInterval is the default of --auth-reload-interval.
const DefaultAuthReloadInterval = 5 * time.Second

func (a *AuthOptions) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&a.APIKeysFile, "api-keys", a.APIKeysFile, "file of API key hashes, one 'sha256:HEX [name=NAME] [rpm=N] [tpm=N]' per line (coordinator hash-key prints one): every /v1/ request needs one of the keys (empty: auth.api_keys_file of --policy, else the API is open)")
	fs.StringVar(&a.MetricsTokenFile, "metrics-token-file", a.MetricsTokenFile, "file holding the bearer token /metrics requires (empty: auth.metrics_token_file of --policy, else /metrics is open)")
	fs.DurationVar(&a.ReloadInterval, "auth-reload-interval", a.ReloadInterval, "how often the --api-keys and --metrics-token-file files are checked for changes, reloaded without a restart (0: only on SIGHUP)")
}

// complete applies the flags to p.Auth and checks the files: the key
// file must parse, and with one every prompt_budgets.api_keys entry must
// name one of its keys.
func (a *AuthOptions) complete(p *config.Policy) error {
	if a.APIKeysFile != "" {
		p.Auth.APIKeysFile = a.APIKeysFile
	}
	if a.MetricsTokenFile != "" {
		p.Auth.MetricsTokenFile = a.MetricsTokenFile
	}
	if p.Auth.APIKeysFile != "" && p.Auth.APIKeysFile == p.Auth.MetricsTokenFile {
		return nil // Validate says what is wrong
	}
	if f := p.Auth.MetricsTokenFile; f != "" {
		if _, err := apikey.LoadToken(f); err != nil {
			return fmt.Errorf("metrics token: %w", err)
		}
	}
	f := p.Auth.APIKeysFile
	if f == "" {
		return nil
	}
	es, err := apikey.ParseFile(f)
	if err != nil {
		return fmt.Errorf("api keys: %w", err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Label())
	}
	budgeted := make([]string, 0, len(p.Budgets.APIKeys))
	for k := range p.Budgets.APIKeys {
		budgeted = append(budgeted, k)
	}
	slices.Sort(budgeted)
	for _, k := range budgeted {
		if !slices.Contains(names, k) {
			return fmt.Errorf("%w: prompt_budgets.api_keys entry %q is not the name of a key of %s: with a key file, budgets are by key name",
				config.ErrInvalid, config.Redact(k), f)
		}
	}
	return nil
}

func (a AuthOptions) validate() []error {
	if a.ReloadInterval < 0 {
		return []error{fmt.Errorf("auth-reload-interval %v must not be negative", a.ReloadInterval)}
	}
	return nil
}

func (o Options) authLogFields() []zap.Field {
	return []zap.Field{
		zap.String("api_keys_file", o.Policy.Auth.APIKeysFile),
		zap.String("metrics_token_file", o.Policy.Auth.MetricsTokenFile),
		zap.Duration("auth_reload_interval", o.Auth.ReloadInterval),
	}
}

// auth is what the coordinator authenticates with.
type auth struct {
	keys  *apikey.Keys  // nil: the API is open
	token *apikey.Token // nil: /metrics is open
}

// loadAuth loads the files of o.Policy.Auth and logs what the API
// requires; without a key file it warns that the API is open.
func loadAuth(o Options, log *zap.Logger) (auth, error) {
	var a auth
	var err error
	if f := o.Policy.Auth.APIKeysFile; f != "" {
		if a.keys, err = apikey.Load(f); err != nil {
			return a, fmt.Errorf("coordinator: api keys: %w", err)
		}
		if a.keys.Len() == 0 {
			log.Warn("the API key file holds no key: every /v1/ request is refused until keys are added", zap.String("file", f))
		} else {
			log.Info("API keys required on /v1/", zap.String("file", f), zap.Int("keys", a.keys.Len()))
		}
	} else {
		log.Warn("no API keys (--api-keys): the API is open to every client that reaches it")
	}
	if f := o.Policy.Auth.MetricsTokenFile; f != "" {
		if a.token, err = apikey.LoadToken(f); err != nil {
			return a, fmt.Errorf("coordinator: metrics token: %w", err)
		}
		log.Info("metrics token required on /metrics", zap.String("file", f))
	}
	return a, nil
}

// watch reloads the files until ctx ends: every ReloadInterval when they
// changed, and on each of ReloadSignals; m counts the failures
// (pdserve_auth_reload_errors_total).
func (a auth) watch(ctx context.Context, o AuthOptions, log *zap.Logger, m *metrics.Metrics) {
	var files []apikey.Reloadable
	if a.keys != nil {
		files = append(files, a.keys)
	}
	if a.token != nil {
		files = append(files, a.token)
	}
	if len(files) == 0 {
		return
	}
	var tick <-chan time.Time
	if o.ReloadInterval > 0 {
		t := time.NewTicker(o.ReloadInterval)
		defer t.Stop()
		tick = t.C
	}
	apikey.Watch(ctx, tick, o.ReloadSignals, log, m.AuthReloadError, files...)
}
