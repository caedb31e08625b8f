package server

import "sync"

// notifier wakes the goroutines waiting on a key (a run's output followers,
// the lease long-polls) when that key changes on this replica. Other replicas'
// changes are picked up by the waiters' own polling.
type notifier struct {
	mu sync.Mutex
	ch map[string]chan struct{}
}

// wait returns a channel closed at the next notify(key).
func (n *notifier) wait(key string) <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch == nil {
		n.ch = map[string]chan struct{}{}
	}
	c, ok := n.ch[key]
	if !ok {
		c = make(chan struct{})
		n.ch[key] = c
	}
	return c
}

// notify wakes every waiter on key.
func (n *notifier) notify(key string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if c, ok := n.ch[key]; ok {
		close(c)
		delete(n.ch, key)
	}
}

// queueKey is the notifier key of the run queue.
const queueKey = "\x00queue"
