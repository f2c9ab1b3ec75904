package conversation

// Waiting is how many retries of a change in progress wait for it.
func (c *Core) Waiting() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waiting
}
