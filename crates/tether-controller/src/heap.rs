//! Ensures a build with `--features heap-stats` reports the bytes its heap holds, so that the
//! soak can tell a leak (live bytes grow) from an allocator that keeps what was freed (RSS grows,
//! live bytes do not). Off by default: a release build uses the system allocator untouched.

/// The system allocator, counting what is allocated and not yet freed.
#[cfg(feature = "heap-stats")]
#[global_allocator]
static ALLOC: cap::Cap<std::alloc::System> = cap::Cap::new(std::alloc::System, usize::MAX);

/// The metric's name.
pub const LIVE_BYTES: &str = "tether_heap_live_bytes";

/// Adds [`LIVE_BYTES`] to the OpenMetrics text `text` in a heap-stats build; otherwise returns it
/// unchanged.
pub fn with_heap(text: String) -> String {
    #[cfg(feature = "heap-stats")]
    {
        let family = format!(
            "# HELP {LIVE_BYTES} Heap bytes allocated and not yet freed (heap-stats build).\n\
             # TYPE {LIVE_BYTES} gauge\n{LIVE_BYTES} {}\n",
            ALLOC.allocated()
        );
        crate::metricsdoc::add_family(text, &family)
    }
    #[cfg(not(feature = "heap-stats"))]
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_live_heap_is_reported_before_eof_only_in_a_heap_stats_build() {
        let text = with_heap("# TYPE up gauge\nup 1\n# EOF\n".to_string());
        assert!(text.ends_with("# EOF\n"), "{text}");
        let value = text
            .lines()
            .find_map(|l| l.strip_prefix(LIVE_BYTES)?.strip_prefix(' ')?.parse::<u64>().ok());
        if cfg!(feature = "heap-stats") {
            let bytes = value.expect("live bytes reported");
            assert!(bytes > 0, "this test's own strings are on the heap: {text}");
        } else {
            assert_eq!(value, None, "{text}");
        }
    }
}
