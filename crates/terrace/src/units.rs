//! Sizes as people write them: `4096`, `256K`, `10G`, `1.5T` (powers of 1024).

pub use terrace_engine::count;
pub use terrace_engine::format_size;
pub use terrace_engine::io::size::{parse_size, SizeError};
