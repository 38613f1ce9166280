//! A valid component of another world (a WASI command): the host must
//! refuse it as not fitting `sluice:nf`.
fn main() {
    println!("I am a command, not a network function");
}
