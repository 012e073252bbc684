module github.com/village-cni/village/test/libcni-v1.1

go 1.26

require github.com/containernetworking/cni v1.1.2
