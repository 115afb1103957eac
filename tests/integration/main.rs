//! The one integration-test binary: every test drives the real `leaseagent`
//! binary (or a real `serve`, etcd, or systemd tool) from a module here;
//! shared helpers live in `support`.
//!
//! Run one area with a filter: `cargo test --test integration agent_failures::`.

mod support;

mod agent_basic;
mod agent_confine;
mod agent_contain;
mod agent_deadline;
mod agent_distrust;
mod agent_failures;
mod agent_files;
mod agent_guardians;
mod agent_operator;
mod agent_pressure;
mod agent_terminal;
mod agent_tree;
mod agent_user;
mod alerts;
mod authority_e2e;
mod authority_embedded;
mod authority_serve;
mod cli_generated;
mod cli_help;
mod client_trust;
mod docs_links;
mod engine_storage;
mod etcd_agent;
mod etcd_authority;
mod etcd_trust;
mod fence_check;
mod fence_examples;
mod fence_publish;
mod fence_sqlite;
mod fence_tables;
mod fence_zombie;
mod history;
mod layout;
mod partition_netns;
mod serve_attack;
mod serve_browser;
mod serve_patroni;
mod serve_replicas;
mod serve_trust;
mod status_page;
mod systemd_deb;
mod systemd_help;
mod systemd_notify;
mod systemd_real;
mod systemd_units;
mod trust_e2e;
