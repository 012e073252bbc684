package storetest

import (
	"testing"

	"github.com/village-cni/village/pkg/ipam/store"
)

func TestMemoryConformance(t *testing.T) {
	Run(t, func(*testing.T) store.Store { return NewMemory() })
}
