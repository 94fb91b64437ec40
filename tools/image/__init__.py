"""Image build and checks: `./task build`, `./task check-image`, and the host and parse-time checks behind them."""
