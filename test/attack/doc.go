// Package attack is Village's attack suite: each test attacks the running
// system for something it must never allow, and passes only when the attack
// is refused. docs/threat-model.md names the attackers (a pod, a user with one
// namespace, a host on the LAN, a stolen node token), what each must never
// get, and the test that proves it.
//
// Two kinds of attack live here:
//
//   - Namespace attacks (the *_test.go files of this package): a test node is
//     a network namespace the test makes, pods are namespaces, a LAN is a
//     bridge in another namespace; the built binaries run there as a runtime
//     would run them. They run in `go test ./test/attack`.
//   - Cluster attacks (the exported functions of this package, each taking a
//     *testing.T and a running *kubecluster.Cluster): a real kubelet cluster
//     installed from the shipped manifests. They start no cluster of their
//     own: test/kube calls them on the clusters its tests already start, so
//     they run in `go test ./test/kube`.
//
// Every feature extends this suite: a new feature lands with the attacks on
// it, and a new line in docs/threat-model.md.
package attack
