// A Java-driver client of the sidecar's CQL endpoint (or of plain Cassandra): one bank
// transfer as a prepared BEGIN TRANSACTION with bound values, and one plain query. Each
// result is one JSON line on stdout; tests/clients/test_java_driver.py reads them. The
// driver runs with its defaults (load balancing, node discovery) but the contact point.
// Mode "cluster": the nodes the driver found, COUNT transfers, then a CREATE TABLE TABLE
// with the driver's own schema-agreement wait off, an INSERT and a SELECT of it at ALL.
//
// usage: java AccordCqlProbe HOST PORT LOCAL_DC KEYSPACE (plain|transfer|both) [SRC DST AMOUNT]
//        java AccordCqlProbe HOST PORT LOCAL_DC KEYSPACE cluster SRC DST AMOUNT TABLE COUNT

import com.datastax.oss.driver.api.core.ConsistencyLevel;
import com.datastax.oss.driver.api.core.CqlSession;
import com.datastax.oss.driver.api.core.DefaultProtocolVersion;
import com.datastax.oss.driver.api.core.config.DefaultDriverOption;
import com.datastax.oss.driver.api.core.config.DriverConfigLoader;
import com.datastax.oss.driver.api.core.cql.ColumnDefinition;
import com.datastax.oss.driver.api.core.cql.PreparedStatement;
import com.datastax.oss.driver.api.core.cql.ResultSet;
import com.datastax.oss.driver.api.core.cql.Row;
import com.datastax.oss.driver.api.core.cql.SimpleStatement;
import com.datastax.oss.driver.api.core.metadata.Node;
import java.net.InetSocketAddress;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

public final class AccordCqlProbe {
  private AccordCqlProbe() {}

  public static void main(String[] args) {
    if (args.length < 5) {
      System.err.println("usage: AccordCqlProbe HOST PORT LOCAL_DC KEYSPACE MODE [SRC DST AMOUNT]");
      System.exit(2);
    }
    String host = args[0];
    int port = Integer.parseInt(args[1]);
    String dc = args[2];
    String ks = args[3];
    String mode = args[4];
    DriverConfigLoader config =
        DriverConfigLoader.programmaticBuilder()
            .withString(DefaultDriverOption.PROTOCOL_VERSION, DefaultProtocolVersion.V4.name())
            .withDuration(DefaultDriverOption.REQUEST_TIMEOUT, Duration.ofSeconds(60))
            .withDuration(DefaultDriverOption.CONNECTION_INIT_QUERY_TIMEOUT, Duration.ofSeconds(30))
            .withDuration(DefaultDriverOption.CONTROL_CONNECTION_TIMEOUT, Duration.ofSeconds(30))
            .withDuration(DefaultDriverOption.METADATA_SCHEMA_REQUEST_TIMEOUT, Duration.ofSeconds(60))
            // No wait of the driver's own after a schema change: the endpoint waits.
            .withDuration(DefaultDriverOption.CONTROL_CONNECTION_AGREEMENT_TIMEOUT, Duration.ZERO)
            .build();
    try (CqlSession session =
        CqlSession.builder()
            .addContactPoint(new InetSocketAddress(host, port))
            .withLocalDatacenter(dc)
            .withConfigLoader(config)
            .build()) {
      line("connected", "\"protocol\":" + str(session.getContext().getProtocolVersion().name()));
      if (mode.equals("transfer") || mode.equals("both")) {
        transfer(session, ks, args[5], args[6], Long.parseLong(args[7]));
      }
      if (mode.equals("cluster")) {
        cluster(session, ks, args[5], args[6], Long.parseLong(args[7]), args[8], Integer.parseInt(args[9]));
      }
      if (mode.equals("plain") || mode.equals("both")) {
        ResultSet rs =
            session.execute("SELECT cluster_name, release_version FROM system.local WHERE key = 'local'");
        emitRows("plain", rs);
      }
    } catch (RuntimeException e) {
      line("error", "\"class\":" + str(e.getClass().getName()) + ",\"message\":" + str(String.valueOf(e.getMessage())));
      System.exit(1);
    }
  }

  private static void cluster(
      CqlSession session, String ks, String src, String dst, long amount, String table, int count) {
    List<String> nodes = new ArrayList<>();
    for (Node node : session.getMetadata().getNodes().values()) {
      nodes.add(str(node.getEndPoint().resolve().toString()));
    }
    line("nodes", "\"nodes\":[" + String.join(",", nodes) + "]");
    for (int i = 0; i < count; i++) {
      transfer(session, ks, src, dst, amount);
    }
    session.execute("CREATE TABLE " + ks + "." + table + " (id text PRIMARY KEY, body text)");
    line("created", "\"table\":" + str(table));
    session.execute(
        SimpleStatement.newInstance("INSERT INTO " + ks + "." + table + " (id, body) VALUES ('a', 'b')")
            .setConsistencyLevel(ConsistencyLevel.ALL));
    emitRows(
        "read",
        session.execute(
            SimpleStatement.newInstance("SELECT id, body FROM " + ks + "." + table)
                .setConsistencyLevel(ConsistencyLevel.ALL)));
  }

  private static void transfer(CqlSession session, String ks, String src, String dst, long amount) {
    String text =
        "BEGIN TRANSACTION\n"
            + "  LET src = (SELECT balance FROM " + ks + ".accounts WHERE id = ?);\n"
            + "  LET dst = (SELECT balance FROM " + ks + ".accounts WHERE id = ?);\n"
            + "  SELECT src.balance, dst.balance;\n"
            + "  IF src.balance >= ? THEN\n"
            + "    UPDATE " + ks + ".accounts SET balance = src.balance - ? WHERE id = ?;\n"
            + "    UPDATE " + ks + ".accounts SET balance = dst.balance + ? WHERE id = ?;\n"
            + "  END IF\n"
            + "COMMIT TRANSACTION";
    PreparedStatement prepared = session.prepare(text);
    ResultSet rs =
        session.execute(prepared.bind(src, dst, amount, amount, src, amount, dst));
    emitRows("transfer", rs);
  }

  private static void emitRows(String what, ResultSet rs) {
    List<String> names = new ArrayList<>();
    for (ColumnDefinition column : rs.getColumnDefinitions()) {
      names.add(str(column.getName().asInternal()));
    }
    List<String> rows = new ArrayList<>();
    for (Row row : rs) {
      List<String> values = new ArrayList<>();
      for (int i = 0; i < names.size(); i++) {
        values.add(value(row.getObject(i)));
      }
      rows.add("[" + String.join(",", values) + "]");
    }
    line(what, "\"columns\":[" + String.join(",", names) + "],\"rows\":[" + String.join(",", rows) + "]");
  }

  private static String value(Object v) {
    if (v == null) {
      return "null";
    }
    if (v instanceof Boolean || v instanceof Number) {
      return v.toString();
    }
    return str(v.toString());
  }

  private static void line(String what, String body) {
    System.out.println("{\"what\":" + str(what) + "," + body + "}");
    System.out.flush();
  }

  private static String str(String s) {
    StringBuilder out = new StringBuilder("\"");
    for (char c : s.toCharArray()) {
      switch (c) {
        case '"': out.append("\\\""); break;
        case '\\': out.append("\\\\"); break;
        case '\n': out.append("\\n"); break;
        case '\r': out.append("\\r"); break;
        case '\t': out.append("\\t"); break;
        default:
          if (c < 0x20) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
      }
    }
    return out.append('"').toString();
  }
}
