"""Developer tasks: `./task test` (the suite, its venvs and host test deps) and `./task lint`."""
