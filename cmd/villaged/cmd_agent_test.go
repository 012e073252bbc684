package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestAgentCommandsNeedConf(t *testing.T) {
	for _, cmd := range []string{"run", "sync", "status"} {
		var out, errb bytes.Buffer
		if code := runMain([]string{cmd}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "--conf is required") {
			t.Errorf("%s without --conf: exit %d, stderr %q", cmd, code, errb.String())
		}
		errb.Reset()
		if code := runMain([]string{cmd, "--conf", "x", "extra"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "unexpected arguments") {
			t.Errorf("%s with an extra argument: exit %d, stderr %q", cmd, code, errb.String())
		}
	}
	var out, errb bytes.Buffer
	if code := runMain([]string{"status", "--conf", "/nonexistent.conflist", "--node-name", "n"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "/nonexistent.conflist") {
		t.Errorf("status with a missing file: exit %d, stderr %q", code, errb.String())
	}
}
