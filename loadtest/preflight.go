package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/pdserve/pdserve/pkg/workload"
)

// preflight checks the inputs every command reads before it starts a
// deployment or sends a request, so that a bad one fails in a second
// instead of after a deployment (or one side of a comparison) has run: it
// loads the workload (dataset file, trace rows, length distributions) and
// keeps it for newBench, computes the arrival schedule at --request-rate,
// and checks that the directories results and plots go to can be written.
// It is called by complete, after the flags are parsed; the errors name
// the flag.
func (o *benchOptions) preflight() error {
	wl, err := workload.Load(o.wl)
	if err != nil {
		if o.DatasetPath != "" {
			return fmt.Errorf("--dataset-name %s --dataset-path %s: %w", o.DatasetName, o.DatasetPath, err)
		}
		return fmt.Errorf("--dataset-name %s: %w", o.DatasetName, err)
	}
	if len(wl.Requests) == 0 {
		return fmt.Errorf("--dataset-name %s: the workload has no requests", o.DatasetName)
	}
	b := &bench{o: o, wl: wl}
	if _, _, _, err := b.schedule(o.RequestRate); err != nil {
		return fmt.Errorf("arrivals at --request-rate %v: %w", o.RequestRate, err)
	}
	if o.SaveResult {
		name := o.ResultFilename
		if name == "" {
			name = "result.json"
		}
		if err := checkWritableDir(filepath.Dir(outPath(o.ResultDir, name))); err != nil {
			return fmt.Errorf("--result-dir/--result-filename: %w", err)
		}
	}
	if dir := plotDir(o); dir != "" {
		if err := checkWritableDir(dir); err != nil {
			return fmt.Errorf("--plot-dir: %w", err)
		}
	}
	o.loaded = wl
	return nil
}

// loadedWorkload returns a copy of the workload preflight loaded, whose
// Requests the caller may change (repeatRequests does), or loads it anew
// when preflight has not run.
func (o *benchOptions) loadedWorkload() (*workload.Workload, error) {
	if o.loaded == nil {
		return workload.Load(o.wl)
	}
	wl := *o.loaded
	wl.Requests = slices.Clone(o.loaded.Requests)
	return &wl, nil
}

// checkWritableDir creates dir when it is missing (the result is written
// there later anyway) and checks that a file can be created in it.
func checkWritableDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".loadtest-check-*")
	if err != nil {
		return fmt.Errorf("%s is not writable: %w", dir, err)
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}
