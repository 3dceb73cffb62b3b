// Runs Debezium's embedded engine once, for bench/bench_vs_debezium.py: the engine's properties
// come from a file the benchmark writes; every change event's JSON value goes to one file, a line
// each (the cheap sink); the run stops once `count` events of `topic` have arrived, closes the
// engine (which commits its offsets, so the next run goes on from there) and prints one line of
// figures. With --signal, a statement is executed on the source once the first event arrived: the
// row it inserts into the signal table starts Debezium's incremental snapshot.
//
//   java -cp 'lib/*:classes' Runner --props FILE --out FILE --topic T --count N \
//        [--signal SQL --jdbc-url URL --user U] [--timeout SECONDS]

import io.debezium.engine.ChangeEvent;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.format.Json;
import java.io.BufferedWriter;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStreamWriter;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.Statement;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;

public final class Runner {

  /** The sink: each event's value on a line of its own; counts the events of one topic. */
  static final class FileSink
      implements DebeziumEngine.ChangeConsumer<ChangeEvent<String, String>> {
    private final BufferedWriter out;
    private final String topic;
    private final long wanted;
    private final CountDownLatch done;
    final CountDownLatch first = new CountDownLatch(1);
    private long seen;
    private long written;
    private long firstNanos;

    FileSink(BufferedWriter out, String topic, long wanted, CountDownLatch done) {
      this.out = out;
      this.topic = topic;
      this.wanted = wanted;
      this.done = done;
    }

    @Override
    public synchronized void handleBatch(
        List<ChangeEvent<String, String>> records,
        DebeziumEngine.RecordCommitter<ChangeEvent<String, String>> committer)
        throws InterruptedException {
      try {
        for (ChangeEvent<String, String> record : records) {
          if (record.value() != null) {
            out.write(record.value());
            out.write('\n');
            written++;
            if (firstNanos == 0) {
              firstNanos = System.nanoTime();
              first.countDown();
            }
          }
          if (topic.equals(record.destination())) {
            seen++;
          }
          committer.markProcessed(record);
        }
        committer.markBatchFinished();
      } catch (IOException e) {
        throw new IllegalStateException("cannot write the sink file", e);
      }
      if (seen >= wanted) {
        done.countDown();
      }
    }

    synchronized long seen() {
      return seen;
    }

    synchronized long written() {
      return written;
    }

    synchronized long firstNanos() {
      return firstNanos;
    }
  }

  private static Map<String, String> arguments(String[] args) {
    Map<String, String> named = new HashMap<>();
    for (int i = 0; i + 1 < args.length; i += 2) {
      if (!args[i].startsWith("--")) {
        throw new IllegalArgumentException("expected --name value pairs, found " + args[i]);
      }
      named.put(args[i].substring(2), args[i + 1]);
    }
    return named;
  }

  private static void signal(Map<String, String> named) throws Exception {
    try (Connection connection =
            DriverManager.getConnection(
                named.get("jdbc-url"), named.get("user"), named.getOrDefault("password", ""));
        Statement statement = connection.createStatement()) {
      statement.execute(named.get("signal"));
    }
  }

  public static void main(String[] args) {
    int code;
    try {
      code = run(args);
    } catch (Throwable error) { // the engine's threads must not keep a failed run's JVM alive
      error.printStackTrace();
      code = 1;
    }
    System.exit(code);
  }

  private static int run(String[] args) throws Exception {
    long started = System.nanoTime();
    Map<String, String> named = arguments(args);
    Properties props = new Properties();
    try (InputStream in = new FileInputStream(named.get("props"))) {
      props.load(in);
    }
    long wanted = Long.parseLong(named.get("count"));
    long timeout = Long.parseLong(named.getOrDefault("timeout", "3600"));
    CountDownLatch done = new CountDownLatch(1);
    AtomicReference<String> failure = new AtomicReference<>();
    BufferedWriter out =
        new BufferedWriter(
            new OutputStreamWriter(
                new FileOutputStream(named.get("out")), StandardCharsets.UTF_8),
            1 << 20);
    FileSink sink = new FileSink(out, named.get("topic"), wanted, done);
    DebeziumEngine<ChangeEvent<String, String>> engine =
        DebeziumEngine.create(Json.class)
            .using(props)
            .notifying(sink)
            .using(
                (boolean success, String message, Throwable error) -> {
                  if (!success || error != null) {
                    failure.compareAndSet(null, message + (error == null ? "" : ": " + error));
                  }
                  sink.first.countDown();
                  done.countDown();
                })
            .build();
    ExecutorService executor = Executors.newSingleThreadExecutor();
    executor.execute(engine);
    if (named.containsKey("signal")) {
      // The first event (a schema change of the no_data snapshot, written after the binlog
      // position streaming starts from was read): a signal inserted now is streamed.
      if (sink.first.await(timeout, TimeUnit.SECONDS) && failure.get() == null) {
        signal(named);
      }
    }
    boolean finished = done.await(timeout, TimeUnit.SECONDS);
    long reached = System.nanoTime();
    try {
      engine.close();
    } catch (IllegalStateException stopped) { // the engine stopped by itself (a failure)
      failure.compareAndSet(null, stopped.getMessage());
    }
    executor.shutdown();
    executor.awaitTermination(120, TimeUnit.SECONDS);
    out.close();
    long closed = System.nanoTime();
    if (!finished) {
      failure.compareAndSet(null, "timed out after " + timeout + " s");
    }
    if (sink.seen() < wanted) {
      failure.compareAndSet(null, "the engine stopped");
      System.err.println(
          "debezium run failed: " + failure.get() + " (" + sink.seen() + " of " + wanted
              + " events of " + named.get("topic") + ")");
      return 1;
    }
    long first = sink.firstNanos();
    System.out.printf(
        "events %d written %d first_event_s %.3f last_event_s %.3f closed_s %.3f%n",
        sink.seen(),
        sink.written(),
        (first - started) / 1e9,
        (reached - started) / 1e9,
        (closed - started) / 1e9);
    return 0;
  }
}
