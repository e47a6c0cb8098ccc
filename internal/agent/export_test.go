package agent

import "context"

// Round runs one round of the clean-up in the caller's goroutine, as the loop Start began does
// at every poll.
func (t *Takeover) Round(ctx context.Context) { t.round(ctx) }
