// Package lanpods is villaged's LAN pods controller ("macvlan.pods":
// "annotated"): it answers the plugin's questions about a Kubernetes pod
// on the agent socket (does it want the LAN interface, which addresses)
// from the Pods and Namespaces of the agent's shared informers, and writes
// back what the ADD did: the pod's village.cni.io/lan-address annotation,
// or a Warning Event saying why it got no LAN address.
//
// The design, in the order a lookup meets it:
//   - The informers are the agent's (pkg/agent builds one factory per
//     process): a Pod informer over this node's pods, or over the whole
//     cluster's when NetworkPolicy needs them too (then this controller
//     filters on spec.nodeName), and the Namespace informer.
//   - A pod the informer has not seen yet (kubelet runs the ADD as soon as
//     the pod is bound) costs one direct read of the API, then a bounded
//     wait for the informer (lanWait); past it the ADD fails retryably
//     (CNI code 11) and kubelet tries the sandbox again.
//   - A namespace may ask only with the label village.cni.io/lan=allowed;
//     a miss in the informer is read from the API (it has the last word).
//   - The annotation patch and the Events are written in the background,
//     so the ADD never waits for the API; the same Event is written at
//     most once per eventEvery while kubelet retries the same ADD.
//   - The lan-address annotation is output only: users may edit it. Which
//     pods hold which LAN addresses (`villaged status`, and HasLAN for the
//     NetworkPolicy controller's LAN warning) comes from the node's own
//     state: the plugin's reports (root-only socket) and the LAN pool's
//     store (Refresh, through Config.Held).
//
// It serves no socket itself: the agent listens and hands the requests to
// a Controller (it implements agentsock.Handler).
package lanpods
