//! The `dpfusion` command: a thin front-end over the engine library (`dpfusion`) and the server
//! (`dpfusion-server`). Every privacy decision is the engine's; this crate only parses arguments, reads files,
//! prints and draws (the charts are `dpfusion-charts`).

mod cli;

fn main() {
    std::process::exit(cli::main());
}
