package agent

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
)

// publishConf copies the staged conflist into the CNI config directory
// (Options.PublishConfDir) under its own file name, atomically (a temporary
// file in that directory, fsync, rename), unless the copy there already has
// the same bytes. It runs once the node holds its pod subnet: a runtime
// that reports the network ready when a conflist appears then never hands
// a pod to Village before it can address it.
func (c *Conf) publishConf(dir string) (bool, error) {
	data, err := os.ReadFile(c.File)
	if err != nil {
		return false, fmt.Errorf("read staged conflist %s: %w", c.File, err)
	}
	dst := filepath.Join(dir, filepath.Base(c.File))
	if old, err := os.ReadFile(dst); err == nil && bytes.Equal(old, data) {
		return false, nil
	}
	tmp, err := os.CreateTemp(dir, ".village-conf-*")
	if err != nil {
		return false, fmt.Errorf("publish conflist into %s: %w", dir, err)
	}
	defer os.Remove(tmp.Name()) // gone after the rename; cleans up a failure
	if _, err := tmp.Write(data); err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	if err != nil {
		return false, fmt.Errorf("publish conflist %s: %w", dst, err)
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
