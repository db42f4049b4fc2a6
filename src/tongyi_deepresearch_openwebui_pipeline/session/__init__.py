"""The run session: how every front end opens a research (`run_session`)."""
