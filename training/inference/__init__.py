"""The inference server: `client` talks to it (importable without torch), `server` starts it."""
