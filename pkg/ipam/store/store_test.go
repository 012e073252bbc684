package store

import "testing"

func TestValidateOwner(t *testing.T) {
	for _, tc := range []struct {
		o  Owner
		ok bool
	}{
		{Owner{"abc123", "eth0"}, true},
		{Owner{"a_b.c-d", "net1"}, true},
		{Owner{"", "eth0"}, false},
		{Owner{"../x", "eth0"}, false},
		{Owner{"a/b", "eth0"}, false},
		{Owner{".a", "eth0"}, false},
		{Owner{"a\r\nb", "eth0"}, false},
		{Owner{"abc", ""}, false},
		{Owner{"abc", "eth/0"}, false},
		{Owner{"abc", "eth:0"}, false},
		{Owner{"abc", "eth 0"}, false},
		{Owner{"abc", "eth\r\n"}, false},
		{Owner{"abc", ".."}, false},
		{Owner{"abc", "a234567890123456"}, false},
		{Owner{"abc", "a\x00"}, false},
	} {
		if err := ValidateOwner(tc.o); (err == nil) != tc.ok {
			t.Errorf("ValidateOwner(%q) = %v, want ok=%v", tc.o, err, tc.ok)
		}
	}
}

// TestOwnerKind: a Service's owner (pkg/lansvc/alloc's prefix) reads back
// as a Service whatever its interface; everything a runtime records is a
// pod's, even an ID that mentions the prefix further in.
func TestOwnerKind(t *testing.T) {
	for _, tc := range []struct {
		owner Owner
		want  OwnerKind
	}{
		{Owner{ContainerID: ServiceOwnerPrefix + "home_web", IfName: "svc"}, OwnerService},
		{Owner{ContainerID: ServiceOwnerPrefix + "home_share-key", IfName: "share"}, OwnerService},
		{Owner{ContainerID: "3f2a9c", IfName: "eth0"}, OwnerPod},
		{Owner{ContainerID: "x" + ServiceOwnerPrefix, IfName: "net1"}, OwnerPod},
		{Owner{}, OwnerPod},
	} {
		if got := tc.owner.Kind(); got != tc.want {
			t.Errorf("%v: kind %s, want %s", tc.owner, got, tc.want)
		}
	}
}
