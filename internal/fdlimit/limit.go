package fdlimit

// Unknown is the limit Raise reports where the system has none to read:
// DefaultMaxStreams of it is a cap that is not the binding one.
const Unknown = 1 << 16
