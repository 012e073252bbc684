package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/village-cni/village/pkg/nodelocal"
)

// publishConf copies the staged conflist into the CNI config directory
// (Options.PublishConfDir) under its own file name, atomically
// (nodelocal.WriteFile), unless the copy there already has
// the same bytes. It runs once the node holds its pod subnet: a runtime
// that reports the network ready when a conflist appears then never hands
// a pod to Village before it can address it.
//
// A file already there that Village did not publish (see publishedByVillage)
// is not overwritten silently: it is first renamed to
// <name>.village-backup-<UTC time>, a name no CNI runtime loads (libcni
// reads only .conf, .conflist and .json), and logf says so. Nothing is
// lost, and the node still gets the network its DaemonSet configures. An
// earlier conflist of Village's is replaced, also with a log line.
func (c *Conf) publishConf(dir string, logf func(string, ...any)) (bool, error) {
	data, err := os.ReadFile(c.File)
	if err != nil {
		return false, fmt.Errorf("read staged conflist %s: %w", c.File, err)
	}
	dst := filepath.Join(dir, filepath.Base(c.File))
	old, err := os.ReadFile(dst)
	switch {
	case err == nil && bytes.Equal(old, data):
		return false, nil
	case err == nil && !publishedByVillage(old, data):
		backup := dst + ".village-backup-" + time.Now().UTC().Format("20060102T150405Z")
		if err := os.Rename(dst, backup); err != nil {
			return false, fmt.Errorf("move aside %s (not written by Village): %w", dst, err)
		}
		logf("%s was not written by Village (no village plugin of network %q in it): moved to %s before publishing", dst, confName(data), backup)
	case err == nil:
		logf("%s holds an earlier conflist of network %q: replacing it", dst, confName(data))
	case !errors.Is(err, fs.ErrNotExist):
		return false, fmt.Errorf("read %s: %w", dst, err)
	}
	if err := nodelocal.WriteFile(dst, data, 0o644); err != nil {
		return false, fmt.Errorf("publish conflist: %w", err)
	}
	return true, nil
}

// confPath is where the runtime reads the conflist from: the published copy
// when run publishes one, else the file it was given.
func (a *agent) confPath() string {
	if a.opts.PublishConfDir != "" {
		return filepath.Join(a.opts.PublishConfDir, filepath.Base(a.c.File))
	}
	return a.c.File
}

// conflistID is what tells a conflist's network and plugins apart.
type conflistID struct {
	Name    string `json:"name"`
	Plugins []struct {
		Type string `json:"type"`
	} `json:"plugins"`
}

func confName(data []byte) string {
	var id conflistID
	_ = json.Unmarshal(data, &id)
	return id.Name
}

// publishedByVillage reports whether old, the file at the conflist's place,
// is one Village published: a conflist of the staged one's network name
// with a plugin of type village (an earlier rendering, before its ConfigMap
// changed). Anything else (another network, no village plugin, not JSON) is
// someone else's.
func publishedByVillage(old, staged []byte) bool {
	var o conflistID
	if err := json.Unmarshal(old, &o); err != nil || o.Name == "" || o.Name != confName(staged) {
		return false
	}
	for _, p := range o.Plugins {
		if p.Type == "village" {
			return true
		}
	}
	return false
}
