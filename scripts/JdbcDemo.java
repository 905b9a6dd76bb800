// What a JDBC client (DBeaver, a BI tool) does against `dpfusion serve`: connect, read the metadata of the tables
// it may see, run a query with a bound parameter, read the release metadata. Run by scripts/serve-demo.sh:
//   java -cp /usr/share/java/postgresql.jar scripts/JdbcDemo.java PORT
import java.sql.*;

public class JdbcDemo {
    public static void main(String[] args) throws Exception {
        String url = "jdbc:postgresql://127.0.0.1:" + args[0] + "/dpfusion";
        try (Connection c = DriverManager.getConnection(url, "alice", "alice-password")) {
            DatabaseMetaData md = c.getMetaData();
            System.out.println("server: " + md.getDatabaseProductName() + " " + md.getDatabaseProductVersion());
            try (ResultSet t = md.getTables(null, "public", "%", new String[] {"TABLE"})) {
                while (t.next()) System.out.println("table: " + t.getString("TABLE_NAME"));
            }
            try (ResultSet col = md.getColumns(null, "public", "pums", "%")) {
                StringBuilder sb = new StringBuilder("columns:");
                while (col.next()) sb.append(' ').append(col.getString("COLUMN_NAME")).append(':').append(col.getString("TYPE_NAME"));
                System.out.println(sb);
            }
            try (PreparedStatement p = c.prepareStatement("SELECT sex, COUNT(*) AS n FROM pums WHERE age >= ? GROUP BY sex ORDER BY sex")) {
                p.setInt(1, 18);
                try (ResultSet r = p.executeQuery()) {
                    ResultSetMetaData rm = r.getMetaData();
                    while (r.next()) System.out.println(rm.getColumnName(1) + "=" + r.getLong(1) + " " + rm.getColumnName(2) + "=" + r.getLong(2));
                }
                for (SQLWarning w = p.getWarnings(); w != null; w = w.getNextWarning()) System.out.println("NOTICE: " + w.getMessage());
            }
            try (Statement s = c.createStatement(); ResultSet r = s.executeQuery("SELECT column_name, ci_half_width, rho_remaining FROM dp_last_release()")) {
                while (r.next()) System.out.println("last release: " + r.getString(1) + " ± " + r.getObject(2) + ", remaining " + r.getDouble(3));
            }
            try (Statement s = c.createStatement()) {
                s.executeQuery("SELECT income FROM pums");
            } catch (SQLException e) {
                System.out.println("refused: " + e.getSQLState() + " " + e.getMessage().split("\n")[0]);
            }
        }
    }
}
