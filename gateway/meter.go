package gateway

import (
	"fmt"
	"sync"
)

// meter counts what the run spends and enforces its budgets.
type meter struct {
	mu          sync.Mutex
	maxTokens   int
	maxRequests int
	used        Usage
	exceeded    error
}

func newMeter(maxTokens, maxRequests int) *meter {
	return &meter{maxTokens: maxTokens, maxRequests: maxRequests}
}

// admit reserves one request, or refuses it with an ErrBudgetExceeded error
// (which Err then reports) when a budget is spent.
func (m *meter) admit() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.maxRequests > 0 && m.used.Requests >= m.maxRequests {
		m.exceed(fmt.Errorf("%w: max_requests=%d spent", ErrBudgetExceeded, m.maxRequests))
		return m.exceeded
	}
	if m.maxTokens > 0 && m.used.TotalTokens() >= m.maxTokens {
		m.exceed(fmt.Errorf("%w: max_tokens=%d spent (%d used)", ErrBudgetExceeded, m.maxTokens, m.used.TotalTokens()))
		return m.exceeded
	}
	m.used.Requests++
	return nil
}

// add records tokens reported by the upstream; going past the token budget
// marks the run as over budget.
func (m *meter) add(prompt, completion int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.used.PromptTokens += prompt
	m.used.CompletionTokens += completion
	if m.maxTokens > 0 && m.used.TotalTokens() > m.maxTokens {
		m.exceed(fmt.Errorf("%w: max_tokens=%d exceeded (%d used)", ErrBudgetExceeded, m.maxTokens, m.used.TotalTokens()))
	}
}

// exceed keeps the first budget error.
func (m *meter) exceed(err error) {
	if m.exceeded == nil {
		m.exceeded = err
	}
}

// remainingTokens is what is left of the token budget, 0 without one.
func (m *meter) remainingTokens() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.maxTokens <= 0 {
		return 0
	}
	return max(m.maxTokens-m.used.TotalTokens(), 1)
}

func (m *meter) usage() Usage {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.used
}

func (m *meter) err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.exceeded
}
