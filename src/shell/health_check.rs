//! What `/healthz` answers: healthy while the loop runs (it answers at
//! all) and each link to the own relay is up, or down but in its first
//! backoff (a relay restart costs one). A supervisor or load balancer
//! reads the status; the body says why.

/// One link to the own relay: open, and its failures in a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Link {
    pub up: bool,
    pub failures: u32,
}

/// `Ok` or the reason for a 503. `write` is the sink's connection (`None`
/// for an embedder's sink), `read` the self-subscription (`None` when
/// turned off).
pub(crate) fn verdict(
    stopping: bool,
    write: Option<Link>,
    read: Option<Link>,
) -> Result<(), String> {
    if stopping {
        return Err("shutting down".to_owned());
    }
    for (name, link) in [("write", write), ("read", read)] {
        if let Some(Link {
            up: false,
            failures,
        }) = link
            && failures > 1
        {
            return Err(format!(
                "own relay {name} link down ({failures} failures in a row)"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UP: Link = Link {
        up: true,
        failures: 0,
    };

    fn down(failures: u32) -> Link {
        Link {
            up: false,
            failures,
        }
    }

    #[test]
    fn healthy_while_links_are_up_or_in_their_first_backoff() {
        assert_eq!(verdict(false, Some(UP), Some(UP)), Ok(()));
        assert_eq!(verdict(false, None, None), Ok(()));
        // Not connected yet, or lost once: still healthy.
        assert_eq!(verdict(false, Some(down(0)), Some(down(1))), Ok(()));
        assert_eq!(
            verdict(false, Some(down(2)), Some(UP)),
            Err("own relay write link down (2 failures in a row)".to_owned())
        );
        assert_eq!(
            verdict(false, None, Some(down(5))),
            Err("own relay read link down (5 failures in a row)".to_owned())
        );
        assert_eq!(
            verdict(true, Some(UP), Some(UP)),
            Err("shutting down".to_owned())
        );
    }
}
