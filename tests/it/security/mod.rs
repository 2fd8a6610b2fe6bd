//! Issue 14's suite: hostile input and the shipped configuration, against
//! real servers. `shipped` starts nats-server with `helm/fleet/files/nats.conf`.

mod api_edges;
mod backlog;
mod faults;
mod garbage;
mod hostile;
mod leaks;
mod roles;
mod shipped;
mod sources;
mod users;
