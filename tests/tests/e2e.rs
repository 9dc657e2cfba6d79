//! Drover's end-to-end tests, linked into one test binary: each module was once its own binary,
//! and every one of those linked the whole stack (~115 MB each with line tables), so a cold
//! build took ~6 GB and a CI machine with a small disk ran out of space. One binary also links
//! once instead of twenty-eight times. Run one module with `cargo test --test e2e <module>::`.

mod agents;
mod architecture;
mod audit;
mod cli;
mod dashboard;
mod day2;
mod delivery;
mod demo;
mod directory;
mod distconfig;
mod downstream;
mod durability;
mod endpoint;
mod explorer;
mod faults;
mod fleet;
mod github;
mod gitrepos;
mod guides;
mod ha;
mod health;
mod hosted;
mod hub;
mod images;
mod import;
mod install;
mod kube_api;
mod local_hosts;
mod machine_failures;
mod machines;
mod openid;
mod plans;
mod provision;
mod provision_guide;
mod proxy;
mod quickstart;
mod rbac;
mod real_cluster;
mod roles;
mod sim;
