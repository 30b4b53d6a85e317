// The tws-map case's checkpoint (bench_checkpoint.py): a two-batch Scala transformWithState
// whose processor puts each input row into the MapState "amounts" (user key id, value
// amount), grouped by g. Run by spark-shell (-I), as PySpark's MapState.updateValue is one
// round trip to the JVM's state server per entry (about 3 ms: hours at 10M entries), while
// the JVM's own put is microseconds. TWS_FOLDER, TWS_KEYS, TWS_PER_GROUP: from the bench.
import org.apache.spark.sql.Encoders
import org.apache.spark.sql.functions._
import org.apache.spark.sql.streaming._

case class GKey(g: String)
case class Entry(g: String, id: Long, amount: Long)
case class UserKey(id: Long)
case class Amount(amount: Long)

class Amounts extends StatefulProcessor[GKey, Entry, (String, Long)] {
  @transient private var amounts: MapState[UserKey, Amount] = _
  override def init(outputMode: OutputMode, timeMode: TimeMode): Unit = {
    amounts = getHandle.getMapState[UserKey, Amount](
      "amounts", Encoders.product[UserKey], Encoders.product[Amount], TTLConfig.NONE)
  }
  override def handleInputRows(
      key: GKey, rows: Iterator[Entry], timerValues: TimerValues): Iterator[(String, Long)] = {
    var n = 0L
    rows.foreach { r => amounts.updateValue(UserKey(r.id), Amount(r.amount)); n += 1 }
    Iterator((key.g, n))
  }
}

val folder = sys.env("TWS_FOLDER")
val keys = sys.env("TWS_KEYS").toLong
val perGroup = sys.env("TWS_PER_GROUP").toLong
spark.conf.set("spark.sql.shuffle.partitions", "8")
spark.conf.set("spark.sql.streaming.stateStore.providerClass",
  "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
val t0 = System.nanoTime
for ((count, step, batch) <- Seq((keys, 1L, 0L), (keys / 10, 10L, 1L))) {
  val ids = col("id") * step
  spark.range(count).select(
    format_string("g%08d", (ids / perGroup).cast("long")).alias("g"),
    ids.alias("id"), (col("id") % 100 + batch).alias("amount")
  ).write.parquet(s"$folder/input/batch=$batch")
  val stream = spark.readStream.schema("g string, id long, amount long")
    .parquet(s"$folder/input/*").as[Entry]
  val q = stream.groupByKey(e => GKey(e.g))
    .transformWithState(new Amounts(), TimeMode.None(), OutputMode.Update())
    .writeStream.format("noop").outputMode("update")
    .option("checkpointLocation", s"$folder/ckpt")
    .trigger(Trigger.AvailableNow()).start()
  q.awaitTermination()
}
println(s"TWS-BUILT ${(System.nanoTime - t0) / 1e9} s")
System.exit(0)
