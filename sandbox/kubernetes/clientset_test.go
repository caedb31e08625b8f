package kubernetes

import (
	k8s "k8s.io/client-go/kubernetes"
)

// clientset is client-go's full clientset on the backend's configuration,
// for the tests' own set-ups and checks beyond the calls the backend makes
// (dry runs, updates).
func (b *Backend) clientset() k8s.Interface { return k8s.NewForConfigOrDie(b.config) }
