//! The leader process of a soak, and how it is started again after a kill.

use std::time::Duration;

use tether_testkit::Controller;

use crate::fleet::LeaderSide;
use crate::probe::procfs::{CLOCK_TICKS, cpu_ticks, process_age, rss_mib};
use crate::probe::prom::metric;

use super::*;

/// The leader and how it was started, so that it can be started again.
pub(super) struct Leader {
    pub(super) side: LeaderSide,
    pub(super) kubeconfig: std::path::PathBuf,
    /// Its memory after each full recovery.
    pub(super) samples: Vec<Sample>,
    /// Whether it has recovered from an API server restart (a relist).
    pub(super) relisted: bool,
}

impl Leader {
    /// This process's life so far, its end sampled now.
    pub(super) async fn life(&mut self) -> Life {
        let end = self.measure().await;
        let mut samples = std::mem::take(&mut self.samples);
        samples.push(end);
        Life {
            samples,
            cpu: cpu_ticks(self.side.controller.pid()) as f64 / CLOCK_TICKS,
            up: process_age(self.side.controller.pid()),
        }
    }

    /// Samples the process's memory after a full recovery from `fault` (`None`: the joins).
    pub(super) async fn sample(&mut self, fault: Option<Fault>) {
        self.relisted |= fault == Some(Fault::ApiServerRestarted);
        let sample = self.measure().await;
        self.samples.push(sample);
    }

    pub(super) async fn measure(&self) -> Sample {
        Sample {
            at: process_age(self.side.controller.pid()),
            rss: rss_mib(self.side.controller.pid(), "VmRSS"),
            heap: self.live_heap().await,
            relisted: self.relisted,
        }
    }

    /// The live heap in MiB, when the binary reports it (a `heap-stats` build): the lowest of
    /// five readings 200 ms apart, so that one in-flight list or batch of heartbeats is not
    /// taken for held memory.
    pub(super) async fn live_heap(&self) -> Option<f64> {
        let mut floor: Option<f64> = None;
        for i in 0..5 {
            if i > 0 {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let (_, text) = self.side.controller.admin_get("/metrics").await.ok()?;
            let mib = metric(&text, tether_controller::heap::LIVE_BYTES)? / (1024.0 * 1024.0);
            floor = Some(floor.map_or(mib, |f| f.min(mib)));
        }
        floor
    }

    pub(super) async fn restart(&mut self) -> Life {
        let life = self.life().await;
        self.side.controller.kill();
        self.side.controller = Controller::start(
            &self.side.cluster,
            "tether-leader",
            &self.kubeconfig,
            &["leader", "--leader-elect=false"],
        )
        .expect("leader process");
        self.relisted = false;
        life
    }
}
