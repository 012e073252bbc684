package allocator_test

import (
	"testing"
	"time"

	"github.com/village-cni/village/pkg/ipam/allocator/stickytest"
	"github.com/village-cni/village/pkg/ipam/store"
	"github.com/village-cni/village/pkg/ipam/store/disk"
	"github.com/village-cni/village/pkg/ipam/store/storetest"
)

// TestStickyMemory runs the sticky suite over the in-memory store, with and
// without a store-wide lock (the disk store's way and the transactional
// stores' way).
func TestStickyMemory(t *testing.T) {
	for _, noLock := range []bool{false, true} {
		var m *storetest.Memory
		stickytest.Run(t, func(t *testing.T, node string) store.Store {
			if node == "a" {
				m = storetest.NewMemory()
				m.NoLock = noLock
			}
			return m
		})
	}
}

// TestStickyDisk runs it over the disk store (one node: "a" and "b" are two
// handles of one data directory).
func TestStickyDisk(t *testing.T) {
	var dir string
	stickytest.Run(t, func(t *testing.T, node string) store.Store {
		if node == "a" {
			dir = t.TempDir()
		}
		d, err := disk.New(disk.Options{DataDir: dir, Network: "sticky", LockTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	})
}
