"""Configuration: the values the plugin runs with (settings), read from flags, environment and
the official plugin's YAML file (loader, cache), and what may change while running (reload_policy)."""
