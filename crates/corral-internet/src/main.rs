//! `corral-internet up TAG` makes an internet ([`corral_internet`]) and
//! prints it as JSON (tag, network, image, server addresses);
//! `corral-internet down TAG` removes it. For tests outside Rust (the
//! Python client's), so they reuse the same servers rather than a copy.

use std::process::ExitCode;

use corral_internet::Internet;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["up", tag] => match Internet::start(tag) {
            Ok(net) => {
                println!("{}", net.to_json());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("corral-internet: {e}");
                ExitCode::FAILURE
            }
        },
        ["down", tag] => {
            Internet::named(tag).tear_down();
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("usage: corral-internet up TAG | corral-internet down TAG");
            ExitCode::from(2)
        }
    }
}
