// A client of Apache Curator's LeaderLatch, for leasehold's interop tests
// and benchmark (crates/leasehold-cli/tests/cli/interop.rs,
// benches/interop.rs): what a Java service using Curator's recipe does.
// Compiled by the test harness against Debian's jars (libcurator-recipes-java,
// whose manifests name the rest of the classpath).
//
//   java LatchClient contend CONNECT LATCH_PATH ID SESSION_TIMEOUT_MS
//     Joins the latch at LATCH_PATH as ID and prints, one line per event:
//       queued PATH      its node is created (PATH: the node)
//       leader ID        hasLeadership became true
//       not-leader ID    it was lost (the session was suspended or lost)
//       releasing        on SIGTERM (a shutdown hook), before latch.close()
//       released         after latch.close() and the client's close: its
//                        node and its session are gone
//
//   java LatchClient observe CONNECT LATCH_PATH
//     Prints `leader ID` (getLeader().getId()) or `none` whenever it
//     changes, polling every 50 ms.
//
// Every line is flushed as it is printed; Curator's and ZooKeeper's own
// logging (slf4j without a binding) goes nowhere or to stderr.

import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.LeaderLatchListener;
import org.apache.curator.framework.recipes.leader.Participant;
import org.apache.curator.retry.RetryForever;

public final class LatchClient {
    private LatchClient() {}

    private static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    private static CuratorFramework client(String connect, int sessionMs) {
        CuratorFramework client = CuratorFrameworkFactory.builder()
                .connectString(connect)
                .sessionTimeoutMs(sessionMs)
                .connectionTimeoutMs(Math.min(sessionMs, 15000))
                .retryPolicy(new RetryForever(100))
                .build();
        client.start();
        return client;
    }

    public static void main(String[] args) throws Exception {
        if (args.length == 5 && args[0].equals("contend")) {
            contend(args[1], args[2], args[3], Integer.parseInt(args[4]));
        } else if (args.length == 3 && args[0].equals("observe")) {
            observe(args[1], args[2]);
        } else {
            System.err.println("usage: LatchClient contend CONNECT LATCH_PATH ID SESSION_TIMEOUT_MS"
                    + " | observe CONNECT LATCH_PATH");
            System.exit(2);
        }
    }

    private static void contend(String connect, String path, String id, int sessionMs)
            throws Exception {
        CuratorFramework client = client(connect, sessionMs);
        LeaderLatch latch = new LeaderLatch(client, path, id);
        latch.addListener(new LeaderLatchListener() {
            @Override
            public void isLeader() {
                say("leader " + id);
            }

            @Override
            public void notLeader() {
                say("not-leader " + id);
            }
        });
        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            say("releasing");
            try {
                latch.close();
            } catch (Exception e) {
                System.err.println("latch.close: " + e);
            }
            // The latch deletes its node in the background; closing the
            // client ends the session, which deletes it in any case.
            client.close();
            say("released");
            stopped.countDown();
        }));
        latch.start();
        String node = null;
        while (node == null && stopped.getCount() > 0) {
            node = latch.getOurPath();
            Thread.sleep(10);
        }
        if (node != null) {
            say("queued " + node);
        }
        stopped.await();
    }

    private static void observe(String connect, String path) throws Exception {
        CuratorFramework client = client(connect, 10000);
        LeaderLatch latch = new LeaderLatch(client, path);
        client.blockUntilConnected(60, TimeUnit.SECONDS);
        String shown = null;
        while (true) {
            String now;
            try {
                Participant leader = latch.getLeader();
                now = leader.isLeader() ? "leader " + leader.getId() : "none";
            } catch (Exception e) {
                // The latch path does not exist (yet, or any more).
                now = "none";
            }
            if (!now.equals(shown)) {
                say(now);
                shown = now;
            }
            Thread.sleep(50);
        }
    }
}
