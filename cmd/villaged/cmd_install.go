package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/village-cni/village/pkg/install"
)

func init() {
	register(command{name: "install", summary: "put binaries and conflist in place atomically", run: runInstall})
	register(command{name: "uninstall", summary: "remove exactly what install added", run: runUninstall})
}

// setFlags collects repeated --set NAME=VALUE.
type setFlags map[string]string

func (s setFlags) String() string { return "" }

func (s setFlags) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("want NAME=VALUE, got %q", v)
	}
	s[k] = val
	return nil
}

func runInstall(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("install", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := install.Options{Vars: map[string]string{}}
	var tmpl, nodeName string
	var withVillaged bool
	fs.StringVar(&o.BinDir, "cni-bin-dir", install.DefaultBinDir, "CNI binary directory")
	fs.StringVar(&o.ConfDir, "cni-conf-dir", install.DefaultConfDir, "CNI config directory")
	fs.StringVar(&o.StageDir, "stage-dir", "", "write the conflist here instead of the CNI config directory; `villaged run --publish-conf-dir` moves it there once the node holds its pod subnet")
	fs.StringVar(&o.StateDir, "state-dir", install.DefaultStateDir, "where the install manifest (install.json) and backups of replaced files live")
	fs.StringVar(&tmpl, "conf", "", "conflist `TEMPLATE` with ${NAME} / ${NAME:-default} placeholders (default: the built-in single-node conflist)")
	fs.StringVar(&o.ConfName, "conf-name", install.DefaultConfName, "file name of the conflist in the config directory")
	fs.StringVar(&o.BinSource, "bin-source", "", "directory holding the binaries to install (default: the directory of this villaged)")
	fs.StringVar(&nodeName, "node-name", "", "the node's name for ${NODE_NAME} (default: $NODE_NAME, else the host name)")
	fs.BoolVar(&withVillaged, "with-villaged", false, "install villaged itself into the CNI binary directory too")
	fs.Var(setFlags(o.Vars), "set", "`NAME=VALUE` for the template (repeatable; beats the environment and detected values)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: villaged install [flags]\n\nCopies village, village-ipam, village-ipam-etcd, village-ipam-kube and loopback into the CNI binary directory and writes\nthe conflist, each atomically; records what it wrote so uninstall removes exactly that.\nTemplate variables: NODE_NAME, NODE_IP, DEFAULT_IFACE, CNI_BIN_DIR, CNI_CONF_DIR, any\n--set NAME=VALUE and any environment variable.\n\nflags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return errUsage
	}
	if nodeName != "" {
		o.Vars["NODE_NAME"] = nodeName
	}
	if tmpl != "" {
		b, err := os.ReadFile(tmpl)
		if err != nil {
			return fmt.Errorf("read template: %w", err)
		}
		o.Template, o.TemplateName = b, tmpl
	}
	if o.BinSource == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find the directory of villaged (give --bin-source): %w", err)
		}
		if p, err := filepath.EvalSymlinks(exe); err == nil {
			exe = p
		}
		o.BinSource = filepath.Dir(exe)
	}
	o.Binaries = append([]string(nil), install.Plugins...)
	if withVillaged {
		o.Binaries = append(o.Binaries, "villaged")
	}
	r, err := install.Install(o)
	if r != nil {
		fmt.Fprint(stdout, r.String())
	}
	return err
}

func runUninstall(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("uninstall", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o install.UninstallOptions
	fs.StringVar(&o.StateDir, "state-dir", install.DefaultStateDir, "where install kept its manifest (install.json)")
	fs.BoolVar(&o.PurgeNetwork, "purge-network", false, "also remove Village's bridges, vshim-* shims, village.<vni> VXLAN devices, routes of protocol 86/87 and masquerade chains")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: villaged uninstall [--state-dir DIR] [--purge-network]\n\nRemoves the files the install manifest lists (files changed since are left alone),\nputs back what install replaced, and with --purge-network the node objects Village made.\n\nflags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return errUsage
	}
	r, err := install.Uninstall(o)
	if r != nil {
		fmt.Fprint(stdout, r.String())
	}
	return err
}
