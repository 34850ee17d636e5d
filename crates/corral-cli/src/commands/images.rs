//! `corral images`: the images on the daemon that sandboxes can name.

use std::process::ExitCode;

use clap::Args;
use serde_json::json;

/// List the images sandboxes can use.
///
/// List the images on the daemon that sandboxes can use (tagged images;
/// snapshots are under `corral snapshots`), newest first.
#[derive(Args, Debug)]
pub struct ImagesArgs {
    /// Print JSON lines instead of a table.
    #[arg(long)]
    json: bool,
}

/// `seconds since the epoch` as UTC `YYYY-MM-DD HH:MM`.
fn utc(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60
    )
}

pub async fn run(config: super::BackendConfig, args: ImagesArgs) -> anyhow::Result<ExitCode> {
    let (_, docker) = super::connect_docker(config).await?;
    let images = docker.images().await?;
    if args.json {
        for i in &images {
            println!(
                "{}",
                json!({"image": i.reference, "size": i.size, "created": i.created})
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    println!("{:<48} {:>10} CREATED (UTC)", "IMAGE", "SIZE");
    for i in &images {
        println!(
            "{:<48} {:>8.1}MB {}",
            i.reference,
            i.size as f64 / 1e6,
            utc(i.created)
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::utc;

    #[test]
    fn dates_are_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00");
        assert_eq!(utc(1_709_210_096), "2024-02-29 12:34");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00");
    }
}
