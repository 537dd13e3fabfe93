//! The store's prefix: what it holds (a survey), whether it is
//! leasehold's, and marking it so.

use super::*;

impl EtcdKeys {
    /// In etcd's recipe layout, refuses a candidate key whose election's
    /// prefix is, or lies inside, a leasehold store: it would stand among
    /// that store's keys, which would refuse to open from then on (the
    /// URL's prefix is checked when the store opens, an election's name
    /// here; found by a review). Checked once per election and handle; a
    /// marker this client may not read is taken as absent, as when opening.
    pub(super) async fn refuse_a_store_election(&self, key: &str) -> Result<()> {
        let Some((election, _)) = key.rsplit_once('/') else {
            return Ok(());
        };
        let dir = format!("{}{election}", self.space());
        if crate::mutex::lock(&self.outside_stores).contains(&dir) {
            return Ok(());
        }
        let ends = (dir.match_indices('/').map(|(i, _)| i))
            .filter(|i| *i > 0)
            .chain(std::iter::once(dir.len()));
        for end in ends {
            let outer = &dir[..end];
            let read = RangeRequest {
                key: format!("{outer}/{MARKER}").into_bytes(),
                ..Default::default()
            };
            let found = match self.range_of("read the store", read).await {
                Ok(found) => found,
                Err(EtcdError::PermissionDenied(_)) => continue,
                Err(error) => return Err(error.into()),
            };
            if found
                .kvs
                .first()
                .is_some_and(|kv| marker_version(kv).is_ok())
            {
                return Err(Error::invalid(
                    "election name",
                    format!(
                        "etcd prefix {dir:?} is, or lies inside, the leasehold store at \
                         {outer:?}; ?layout=concurrency needs a prefix of its own"
                    ),
                ));
            }
        }
        crate::mutex::lock(&self.outside_stores).insert(dir);
        Ok(())
    }

    /// Reads the marker, the prefix's first key and the markers of
    /// enclosing prefixes, in one transaction.
    ///
    /// With etcd's authentication on, a user may be granted its prefix
    /// only (`readwrite --prefix=true /PREFIX/`), and then reading an
    /// enclosing prefix's marker is `permission denied`. Such a marker is
    /// then taken as absent, and left out of the guards of the marker's
    /// creation: a store inside another is refused to keep leasehold's keys
    /// apart, and a user who cannot read the enclosing prefix cannot read
    /// or write that store's keys either, so its grants keep the two apart
    /// (an operator granted this prefix alone). The markers it may read are
    /// still checked.
    pub(super) async fn survey(&self) -> Result<Survey> {
        let enclosing = self.enclosing_markers();
        match self.survey_with(&enclosing).await {
            Err(EtcdError::PermissionDenied(_)) if !enclosing.is_empty() => {}
            other => return other.map_err(Error::from),
        }
        let mut survey = self.survey_with(&[]).await?;
        for key in enclosing {
            let read = RangeRequest {
                key: key.clone().into_bytes(),
                ..Default::default()
            };
            match self.range_of("read the store", read).await {
                Ok(found) => {
                    if survey.enclosing.is_none()
                        && found
                            .kvs
                            .first()
                            .is_some_and(|kv| marker_version(kv).is_ok())
                    {
                        survey.enclosing =
                            key.strip_suffix(&format!("/{MARKER}")).map(str::to_owned);
                    }
                    survey.readable.push(key);
                }
                Err(EtcdError::PermissionDenied(_)) => {
                    tracing::debug!(
                        key,
                        "etcd: no permission to read an enclosing prefix's marker; taken as absent"
                    );
                }
                Err(error) => return Err(error.into()),
            }
        }
        Ok(survey)
    }

    /// The marker, the first key under the prefix and the `enclosing`
    /// markers, read in one transaction.
    pub(super) async fn survey_with(&self, enclosing: &[String]) -> Result<Survey, EtcdError> {
        let mut reads = vec![
            get(self.marker_key()),
            RequestOp {
                request: Some(pb::request_op::Request::RequestRange(RangeRequest {
                    limit: 1,
                    keys_only: true,
                    ..range_of_prefix(&self.space())
                })),
            },
        ];
        reads.extend(enclosing.iter().map(|key| get(key.clone())));
        let txn = TxnRequest {
            compare: Vec::new(),
            success: reads,
            failure: Vec::new(),
        };
        let read = self.txn("read the store", txn).await?;
        let mut ranges = read.responses.into_iter().map(|r| match r.response {
            Some(pb::response_op::Response::ResponseRange(range)) => range,
            _ => pb::RangeResponse::default(),
        });
        let marker = ranges.next().and_then(|r| r.kvs.into_iter().next());
        let first_key = ranges
            .next()
            .and_then(|r| r.kvs.into_iter().next())
            .map(|kv| kv.key);
        let found = ranges
            .zip(enclosing)
            .find(|(r, _)| r.kvs.first().is_some_and(|kv| marker_version(kv).is_ok()))
            .and_then(|(_, key)| key.strip_suffix(&format!("/{MARKER}")).map(str::to_owned));
        Ok(Survey {
            revision: revision_of(read.header.as_ref()),
            marker,
            first_key,
            enclosing: found,
            readable: enclosing.to_vec(),
        })
    }

    /// Checks that the prefix is a leasehold store this build can use, and
    /// (unless read-only) makes it one if it is empty. Writes nothing
    /// otherwise.
    pub(super) async fn open_space(&self) -> Result<()> {
        for attempt in 0..ATTEMPTS {
            let survey = if attempt == 0 {
                self.first_survey().await?
            } else {
                self.survey().await?
            };
            if self.is_usable_store(&survey)? {
                return Ok(());
            }
            let guards = self.marking_guards(&survey)?;
            if self.mark_space(guards).await? {
                return Ok(());
            }
            // The prefix changed between the read and the write: read again.
        }
        Err(Error::Unavailable {
            reason: format!(
                "etcd prefix {} kept changing while leasehold checked it",
                self.prefix
            ),
            source: None,
        })
    }

    /// The first request: fails now, with the endpoints named, rather than
    /// at the first campaign.
    pub(super) async fn first_survey(&self) -> Result<Survey> {
        self.survey().await.map_err(|e| {
            let cause = match e {
                Error::Unavailable { reason, .. } => reason,
                // A refusal or a bad TLS file says why in one line already.
                other @ (Error::Denied(_) | Error::InvalidInput { .. }) => return other,
                other => other.to_string(),
            };
            Error::Unavailable {
                reason: format!(
                    "cannot reach etcd at {}: {cause}",
                    self.members.endpoints().join(",")
                ),
                source: None,
            }
        })
    }

    /// Refuses etcd's recipe layout at a prefix that is, or lies inside, a
    /// leasehold store: its candidates would stand among that store's keys,
    /// and that store's candidates among its own (found by a review). A
    /// marker this client may not read is taken as absent, as in
    /// [`Self::survey`].
    pub(super) async fn refuse_a_store_prefix(&self) -> Result<()> {
        if self.prefix.is_empty() {
            return Ok(());
        }
        let survey = match self.survey().await {
            Err(Error::Denied(_)) => return Ok(()),
            other => other?,
        };
        if let Some(outer) = &survey.enclosing {
            return Err(Error::invalid(
                "store URL",
                format!(
                    "etcd prefix {} is inside the leasehold store at prefix {outer}; \
                     ?layout={} needs a prefix of its own",
                    self.prefix, self.layout
                ),
            ));
        }
        if survey
            .marker
            .as_ref()
            .is_some_and(|kv| marker_version(kv).is_ok())
        {
            return Err(Error::invalid(
                "store URL",
                format!(
                    "etcd prefix {} is a leasehold store (it has the marker {}); \
                     ?layout={} needs a prefix of its own",
                    self.prefix,
                    self.marker_key(),
                    self.layout
                ),
            ));
        }
        Ok(())
    }

    /// Whether the surveyed prefix is a leasehold store this build can use
    /// (marked); refuses one inside another store or of a newer layout.
    pub(super) fn is_usable_store(&self, survey: &Survey) -> Result<bool> {
        if let Some(outer) = &survey.enclosing {
            return Err(Error::Corrupt(format!(
                "etcd prefix {} is inside the leasehold store at prefix {outer}; \
                 use a prefix of its own",
                self.prefix
            )));
        }
        let Some(marker) = &survey.marker else {
            return Ok(false);
        };
        let found = marker_version(marker)?;
        if found > LAYOUT_VERSION {
            return Err(Error::IncompatibleSchema {
                found,
                supported: LAYOUT_VERSION,
            });
        }
        Ok(true)
    }

    /// The conditions under which the unmarked, surveyed prefix may be
    /// marked: empty, and no enclosing prefix became a store. A prefix that
    /// holds any key is refused with [`Error::Corrupt`], naming one; an
    /// empty one opened read-only is [`Error::NotFound`].
    pub(super) fn marking_guards(&self, survey: &Survey) -> Result<Vec<pb::Compare>> {
        if let Some(key) = &survey.first_key {
            return Err(Error::Corrupt(format!(
                "etcd prefix {} holds keys leasehold did not write (such as {}); \
                 use a prefix of its own",
                self.prefix,
                shown(key)
            )));
        }
        if self.read_only {
            return Err(Error::NotFound(format!(
                "at etcd prefix {}: nothing has campaigned there yet",
                self.prefix
            )));
        }
        // No enclosing prefix (that this client may read) became a store
        // meanwhile, and the prefix is still empty.
        let mut guards: Vec<pb::Compare> = survey
            .readable
            .iter()
            .cloned()
            .map(|key| {
                let key = RangeRequest {
                    key: key.into_bytes(),
                    ..Default::default()
                };
                unchanged_since(&key, survey.revision)
            })
            .collect();
        guards.push(no_key_in(&range_of_prefix(&self.space())));
        Ok(guards)
    }

    /// Writes the marker if `guards` hold; `false` if they did not (the
    /// prefix changed).
    pub(super) async fn mark_space(&self, guards: Vec<pb::Compare>) -> Result<bool> {
        let txn = TxnRequest {
            compare: guards,
            success: vec![put(
                self.marker_key(),
                format!("leasehold {LAYOUT_VERSION}"),
                0,
            )],
            failure: Vec::new(),
        };
        if self.txn("create the store", txn).await?.succeeded {
            tracing::debug!(prefix = %self.prefix, "marked the etcd prefix as leasehold's");
            return Ok(true);
        }
        Ok(false)
    }
}
