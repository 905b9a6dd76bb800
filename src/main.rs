//! The `dpfusion` command: a thin front-end over the library (see `dpfusion::cli`).

fn main() {
    std::process::exit(dpfusion::cli::main());
}
