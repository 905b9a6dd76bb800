//! The `dpfusion` command: a thin front-end over the library. Every privacy decision is the library's; this crate
//! only parses arguments, reads files and prints.

mod cli;

fn main() {
    std::process::exit(cli::main());
}
