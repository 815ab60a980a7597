"""Build the audited safety list (src/chunlian/resources/blocklist.tsv) from the upstream list.

Usage: python scripts/audit_blocklist.py [--counts benchmarks/results/2026-12-07-safety-list-pairs.json]

Every upstream term (resources/blocklist.upstream.txt, MIT, v-zich/couplet-clean-dataset) gets
one row: its form as listed, its simplified form, a category, a decision and the reason, and
the corpus pairs (over ../shared/data/couplets/*.tsv: scripts/blocklist_pairs.py) that hold it. The categories come from
the term sets below, read term by term for every term that occurs in the corpora, and from
keyword rules for the rest. Kept terms also carry their traditional forms, computed here so
that loading the list at start-up converts nothing.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import zhconv

ROOT = Path(__file__).resolve().parent.parent
RES = ROOT / "src" / "chunlian" / "resources"

SEXUAL, INSULT, VIOLENCE, DRUGS, POLITICAL, ORDINARY = (
    "sexual", "insult", "violence", "drugs", "political", "ordinary")


def words(s: str) -> set[str]:
    return set(s.split())


# Terms found in the corpora, read one by one: the ones that stay. Every other term found in
# the corpora is an ordinary word (its pairs, read in samples, are festive, classical or
# everyday lines: 万里, 吹箫, 山阴道, 水乳交融, 桃李长春).
KEEP_SEEN = {
    SEXUAL: words("""
淫 滛 婬 妓 嫖 鸨 娼 屌 婊 肏 屄 睾 龟头 三陪 一夜情 淫欲 阴茎 阴唇 阴蒂 阴毛 阴户 阴囊 阴部 阴核
阴精 阴穴 阴门 鸡巴 鸡八 机八 机吧 牛逼 露逼 老逼 日逼 色逼 骚逼 大逼 小逼 二逼 装逼 骚货 骚浪 骚包
骚水 骚女 发骚 做爱 作爱 性爱 性交 性欲 交媾 口交 足交 脚交 射精 遗精 梦遗 勃起 阳具 阳物 精液
乱伦 滥交 群交 乱交 野合 裸聊 群奸 轮奸 强奸 奸淫 强暴 嫖娼 嫖客 妓女 妓院 娼妓 卖淫 招嫖 招妓
援交 叫鸡 做鸡 拉皮条 皮条客 老鸨 荡妇 淫妇 荡女 浪女 破鞋 色魔 黄片 毛片 女优 一本道 大奶 奶子
奶头 巨乳 爆乳 波霸 胸推 乳沟 乳晕 乳尖 露乳 插我 美穴 扒穴 菊门 屁眼 推油 淫秽 淫荡 淫乱 淫色
淫人 淫书 淫浪 淫娃 淫图 淫水 淫威 色淫 一夜欢 性器 性生活 性骚扰 色成人 大奶头 阴水 三陪女 吸精
颜射 招鸡 轮操 吃精 喷精 爱液 蜜液 米青 奸污 相奸 色链 淫 性无能 性病 骚 妓 奸情 日烂 干比 被干 骚逼 鸡鸡 屎
吃屎 狗屎 烂鸟 阳精 精水 摸你 捏弄 比卵 老比 狗比 淫欲
"""),
    INSULT: words("""
婊子 王八蛋 杂种 贱人 混蛋 瘪三 小瘪三 傻逼 狗日 狗日的 我操 操蛋 他妈 他妈的 你妈 你娘 他娘的 你娘的
狗娘 龟孙子 人渣 脑残 蠢猪 傻鸟 狗屁 我草 娘西皮 下三烂 支那 小日本 美国佬 黑鬼 南蛮子 老毛子
韩国狗 贱货 烂货 妈比 二逼 狗养 狗日 娘的 日你娘 操他 贱
"""),
    VIOLENCE: words("""
杀人 杀人犯 屠杀 屠城 血洗 暗杀 谋杀 绑架 拐卖 抢劫 打砸抢 自残 毁容 袭警 圣战 本拉登 枪支
办证 假证 假文凭 假钞 假币 假钱 伪钞 刻章 洗钱 窃听器 监听 电击 电棒 警棍
"""),
    DRUGS: words("冰毒 摇头丸 海洛因 可卡因 杜冷丁 麻古 麻果 缅古 麻谷 迷药 昏药 古柯 大麻油 藏毒 烟膏"),
    POLITICAL: words("""
法轮功 转法轮功 李洪志 真善忍 大纪元 新唐人 明慧网 九评 退党 台独 藏独 疆独 东突 达赖 反共 共匪
土共 共党 邪党 恶党 共惨 仇共 两国论 台湾独 毛泽东 周恩来 朱德 刘少奇 邓小平 江泽民 胡锦涛 温家宝
习近平 李克强 胡耀邦 朱镕基 吴邦国 贾庆林 周永康 王岐山 张高丽 贺国强 薄熙来 徐才厚 令计划 陈良宇
华国锋 李先念 毛主席 周总理 温总理 李总理 华主席 陈水扁 阿扁 李登辉 马英九 宋楚瑜 林彪 张春桥 陈伯达
赵紫阳 薄一波 叶剑英 董必武 任弼时 瞿秋白 刘少奇 贺龙 许世友 秦基伟 张万年 尉健行 李先念 曾庆红
吴官正 罗干 李岚清 乔石 吴仪 许其亮 马凯 戴秉国 回良玉 张德江 刘云山 俞正声 李源潮 王兆国 刘淇
陈云 江青 王洪文 姚文元 康生 胡乔木 胡启立 宋平 李瑞环 李铁映 邹家华 丁关根 田纪云 杨尚昆 彭真
聂荣臻 徐向前 刘伯承 罗荣桓 陈毅 彭德怀 邓颖超 李希 黄兴国 宋任穷 纪登奎 倪志福 陈锡联 华建敏
"""),
}

# Read and found ordinary after all (their pairs: 健康生活, 江青山, 贺龙年, 凯旋, 宋平章, 忠奸情, 热血洗):
for _terms in KEEP_SEEN.values():
    _terms -= words("康生 江青 陈云 马凯 贺龙 宋平 李希 张万年 奸情 鸡鸡 阴水 娘的 比卵 精水 捏弄 摸你 老比 干比 性病 电击 电棒 警棍 监听 圣战 自残 血洗 阴精 阴门 阴穴 荡女 一夜欢 野合")

# Full names of officials on the list that are also common given names: any family may be
# called so, and a user's name must be writable.
COMMON_NAMES = words("""
王伟 王勇 刘伟 张杰 李建国 杨帆 刘杰 张磊 王刚 刘军 林军 张军 马强 张林 张平 何平 何勇 陈良 刘青 王克 王侠
刘刚 刘京 刘慧 林伟 徐明 杨勇 周强 张毅 张阳 杨刚 杨晶 周英 张钢 王毅 李康 李斌 王荣 汤涛 徐斌 彭枫 周贺
李熙 武雷 王策 杨巍 郑义 石进 陈功 陈希 傅鹏 薛伟 张基 李禄 李录 陆浩 程凯 唐捷 戴晶 杨佳 冉英 沈彤 王沪
祁建 韩光 朱林 刘鹏 蔡武 杨周 周莹 孔丹 符强 胡平 黄晶 邓发 陈建国 孙建国 徐建国 黄建国 张建平 王建平 王建军
张伟国 张志国 李立国 李向东 张小平 王秀丽 王莉莉 张志清 李文斌 王学军 李海峰 李小雪 张伟华 王民生 刘建华
王润生 李斌 张健 刘军 高俊 何峰 张震 马强 杨振 王华庆 王克 李昌 张军 张林 林明月 张海阳 王志刚 张晓平 王立英
李老师 李师傅 李师付 李大师 李师父 王东明 张宝顺 刘永清 王振华 王旭东 陈至 张轩 陈车 陈军 杨林 杨松 郭平
王磊 周英 张高 陈元 刘源 孙大发 刘志军 何平 王昊 杨杰 徐天亮 王冶坪 李向东 刘成军 赵小明 王晓初 刘振来
""")

# Keyword rules for the terms that do not occur in the corpora (checked in this order).
RULES: list[tuple[str, str]] = [
    (DRUGS, r"冰毒|海洛|可卡|古柯|摇头|K粉|氯胺酮|麻古|麻果|缅果|杜冷丁|吗啡|鸦片|大麻|芬太尼|曲马多|三唑|安眠酮|"
            r"苯丙胺|甲基|麦角|哌|美沙酮|罂粟|冰(古|砖|钻|读|油)|(成品|化学|植物|水晶|果子|奶油|北极|钻石|牙签|骚|纯|麻古)冰|"
            r"冰牙签|麻黄|可待因|安钠咖|咖啡(因|碱)|羟亚胺|苯|胡椒醛|醋酸酐|盐酸|氯仿|乙醚|丙酮|致幻|迷幻|磕药|嗑药|"
            r"卡因|地西泮|阿片|阿芙蓉|蒂巴因|那可汀|枸橼|生鸦片|乖乖(粉|药|水)|神仙(水|糖)|开心水|喵喵药|沙菲片|"
            r"去氧|硅烷|戊基|呋塞米|氯噻嗪|泼尼松|地高辛|地奈德|黄体酮|甲睾酮|左旋素|依星|雅照|马𫘜|苍蝇(水|粉)|"
            r"海乐神|蒙汗|蒙尘药|喂奶|麦叫酸|莓牛奶|酮|胺|吸毒|贩毒|毒贩|毒豺|大妈油|火麻|烟膏|白冰|冰锋|绿冰|赌博粉|"
            r"打牌药|整人药|破氧|化骨水|代血浆|婴儿汤|福呵定|威而(钢|柔)|蚁力神|氯氮卓|咨讯|锡纸"),
    (SEXUAL, r"淫|屄|逼|穴|屌|肏|鸡巴|鸡吧|鸡八|机八|机巴|机吧|鸡叭|机叭|几吧|几巴|几八|几叭|几芭|鸡芭|机掰|鸡掰|"
             r"阴(茎|唇|蒂|毛|户|部|囊|阜|核|缔|精|水)|乳(交|头|房|沟|晕|尖|射|爆|霸|罩)|(美|巨|豪|暴|艳|玉|骚|揉|大)乳|"
             r"奶(子|头|罩)|(揉|舔|摸|嫩)奶|咪咪|性(交|爱|奴|虐|欲|器|感|伴侣|高潮|饥渴|用品|服务|技巧|息|派对|之|吧|佣|虎|佣)|"
             r"做爱|作爱|造爱|口(交|爆|射|活)|肛|射(精|了|你|爽|奶|颜)|颜射|精(液|子|虫|童)|手淫|自慰|龟头|睾|"
             r"强奸|轮(奸|暴|干|操|公)|诱奸|奸|嫖|妓|娼|婊|鸨|三陪|坐台|卖(逼|比|骚|春)|援(交|助妹)|裸|色情|"
             r"三级|二级片|无码|有码|无修正|少修正|东京热|一本道|骚|浪(妇|叫)|荡(妇|女|妹)|插|抽插|操(逼|比|屄)|舔|"
             r"屁眼|菊花(洞|蕾)|爆菊|乱伦|乱交|群交|换妻|人兽|兽|肉(棒|棍|洞|缝|唇|壁|茎|便器|具|壶|蒲团|欲|沟)|开苞|"
             r"处女|処女|阳(具|物|精|痿|萎|菜)|早泄|遗精|勃起|炮(友|图)|打(野炮|飞机|炮)|叫(床|春)|做鸭|找鸭|是鸭|鸭店|"
             r"找小姐|叫小姐|包(夜|射|吹|爽)|推油|丝(诱|袜)|美(臀|腿|幼|少妇)|熟(女|妇|母)|幼(齿|女|男|交|图|妓)|"
             r"自拍|偷拍|私拍|盗撮|AV|色(图|区|友|狼|猫|窝|影院|电影|中色|咪咪|盟|书库|空寺|迷城|弟弟|诱|狗)|"
             r"黄片|毛片|成人片|艳(星|舞|照|门|旅|乳)|女优|换妻|房事|同房|交配|伟哥|春药|催情|爽(片|图|穴)|十八摸|"
             r"脱(衣|光|内裤)|露(点|毛|阴|乳)|体位|野合|红灯区|应召|钢管舞|陪(睡|聊)|寂寞(女|男)|欲女|浪女|嫩|爱液|"
             r"蜜(液|汁|洞)|流蜜|湿了|好爽|日爽|干(死|爽|爆|炮)|被(干|操|插)|慰春情|释欲|欲火|情色|偷情|艳|体奸|"
             r"生殖器|处男|淋病|梅毒|性病|艾滋|避孕|套弄|丁字裤|内射|内衣|内裤|胸(垫|罩|摧|推)|抓胸|摸胸|坐脸|"
             r"三角裤|援交|菊门|鸡(女|院|店)|做鸡|叫鸡|是鸡|招鸡|骑(你|她|他)|欠(操|干|骑)|男奴|警奴|厕奴|虐奴|性"),
    (INSULT, r"操|草(你|拟|妈|泥|嫣)|日(你|他|她|死|啊|批|领馆)|干(你|他|她|您|拎|啦|勒|尼|一干|的你|死你|七八|嫂子|娘)|"
             r"入你|(你|他|她|它|那)(妈|娘|马|吗|母亲|老母|姥|奶|爸|爷|祖宗|大爷|全家|老味|老妹)|妈(逼|比|批|的)|"
             r"尼玛|傻(逼|屄|比|批|吊|卵|B|瓜|子)|煞(笔|逼)|刹笔|狗(日|娘|杂种|操|屎|卵|乘|草|干|诚|城)|"
             r"王八|杂种|贱|去(你|他|她)|龟(儿子|孙|公|奴)|瘪三|猪(猡|操|头|容基|聋畸)|人渣|脑残|知障|智障|"
             r"蠢猪|婊子|滚|靠(北|腰|夭|么|母|你)|卧艹|艹你|叼你|屌|赛(你|她|他)|塞你|驶你|屎你|食(屎|捻屎)|"
             r"吃(屎|大便)|鸟你|仆街|册那|侧那|八嘎|鞑子|支那|南蛮|倭|(台湾|中国|犹太|韩国|高压|步|钢珠|钢针|土仿|折叠|电|战|汽|军|火|手|仿真|麻)(猪|狗)|"
             r"共狗|满狗|走私狗|米田共|乡巴佬|瓜(婆娘|娃子|批)|呆(比|卵)|笨(逼|屄|比)|菜逼|死逼|歪逼|温逼|瘟比|"
             r"哈批|个批|喷你|捅(你|他|她|我|死你|逼|比)|阿共|臭西|舔西|要色色|你是鸡|你色吗|小比样|比样|逼样|"
             r"烂(人|屌|比|货|游戏)|下(三滥|三烂|贱)|挨球|你麻痹|麻痹的|馒头|不玩了|混蛋|完蛋操|我(日|操|干|草|咧干|就色|奸)|"
             r"哭(夭|么)|娘饿比|娘个比|娘比|卖比|骡干|猫贼洞|灨|懆|赣您|豖者|人木又|他吗|她马|它妈|他马|吗的|吗比|"
             r"吗逼|那吗逼|滚那吗|别他吗|刚比|刚瘪三|老瘪三|狗剩|山猪|秃鹰"),
    (VIOLENCE, r"枪|刀|弩|炸(药|弹|学校)|雷管|手榴弹|爆(炸物|器|药)|燃烧(弹|瓶|剂)|汽油弹|杀|砍|捅死|毒药|氰化|"
               r"铊|硝(酸|铵|化|胺)|铝热|光气|沙林|黑索金|起爆器|引爆器|电(击|棍|警棍|狗)|催泪|催眠|失(忆|身)|"
               r"听话(水|药)|迷(奸|魂|昏|情|歼|烟|香|晕|药)|肩迷药|昏(睡|迷)药|办(证|假|驾驶)|假(证|币|钞|发票|护照|"
               r"文凭|学历|车牌|牌|硬币|钱|酒|烟|言正)|高仿|伪(币|火)|代(考|开|做|链|练|炼|挂|制|办)|替考|刻章|"
               r"售(假|证|号|护照|驾照|肾|枪|冰毒|卡|言正|公文|软件|冰)|卖(肾|肝|枪|护照|驾照|证件|公文|号|卡|币|月卡|财富|软件|言正)|"
               r"买(肾|枪|币|月卡|财富|小车)|收购(肾|肝)|(肾|肝)源|捐(肾|肝)|器官|窃听|监听|干扰|拦截器|解码|作弊|"
               r"偷电|盗电|黑社会|洗钱|绑架|拐卖|劫机|抢(劫|尸|粮)|暗杀|谋杀|屠|血(洗|书)|毁容|袭警|杀警|黑手党|"
               r"山口组|新义安|洪兴|四海帮|(瘸腿|嘭嘭|推推|清华|北京|上海)帮|恐怖|爆炸|核(弹|潜艇|蛋|武器)|导弹|"
               r"子弹|弹(药|簧刀)|铅弹|钢珠|集束|防暴|军(刺|刃|用|品|火|事社)|警(用|服|徽|衔|灯|号|官证|察证)|"
               r"(军人|军官|士兵|记者|学生|警官|工作|职称|资格|学历|学位|六级|国安|户口|驾驶|行驶|房产)证|证件|"
               r"指纹(膜|套)|透视(镜|器)|作弊器|看(牌|棋)器|预测器|复制器|定位器|消音器|屏蔽器|上分器|破解器|"
               r"(信号|电视|扫描)(枪|棒)|小口径|射(鱼弩|钉)|甩(刀|棍)|开刃|弓单|木仓|猎|管猎|气狗|秃鹰|"
               r"赌|六合采|特码|押(大|小)|老虎机|轮盘|百家乐|博彩|龙虎机|彩票机|二码|九码|庄|"
               r"白牙签|黄牙签|牙签冰|打手|人质|劫|犯人|监狱|强卫|火棒|天阉|阉割|活体|射钉|人皮|奴事件|抢火炬"),
    (POLITICAL, r"法.?(轮|伦|论|仑|沦|纶|抡|囵|崘|磮|惀|陯|婨|蜦|腀|碖|踚|溣|鯩|棆|耣|稐|黁|𰰨|𬬭|𫭢)|"
               r"(轮|伦|仑|沦|纶|抡|论|发|功|罚|伐|乏|阀|筏|砝|垡|珐)(功|轮|伦|论|仑|沦|纶|抡|囵)|大法|李.?[洪弘宏红]"
               r"[志智治痔旨]|[洪宏弘虹荭闳泓红]志|真善忍|正念|功友|明慧|大纪|新唐人|九评|退党|党退|"
               r"(台|藏|疆|蒙|西藏|新疆|四川|蒙古|台湾|葬|臧)独|独立|东突|达赖|哒赖|达癞|六四|陆肆|八九|天[安按]门|"
               r"民运|民主|学潮|学运|学自联|高自联|工自联|北高联|反(共|华|党|政府|人民|社会|封锁|奥|腐)|灭共|仇共|"
               r"共(产|铲|残|惨|贪|匪|狗|党|军|荣圈)|(土|老|阿)共|赤(匪|化)|[裆挡档贡]中央|邪党|恶党|亡党|"
               r"五毛|太子|江(核心|八|派|氏|某|戏|独|猪|折|泽|择|则|沢|浙民|责|绵|贼|流氓|哥|主席|书记|蛤蟆|罗|胡)|"
               r"胡(锦|紧|惊|景|江|温|派|海峰|春华|总|主席|书记)|温(家|加|宝宝|元凯)|习(近|氏|太子|明泽|仲勋|平)|平近习|"
               r"李(鹏|克强|长春|岚清|瑞环|源潮|铁映)|朱(镕|容|狨|熔|荣|溶)|薄熙|令计划|周永康|徐才厚|郭伯雄|"
               r"毛(泽|贼|太祖|主席|相)|猫(泽|则)东|邓(小平|晓平|笑贫|朴方|榕|楠|质方|颖超|力群)|周(恩来|容|总理)"),
]
SURNAMES = ("王张刘李陈杨赵黄周吴徐孙胡朱高林何郭马罗梁宋郑谢韩唐冯于董萧程曹袁邓许傅沈曾彭吕苏卢蒋蔡"
            "贾丁魏薛叶阎余潘杜戴夏钟汪田任姜范方石姚谭廖邹熊金陆郝孔白崔康毛邱秦江史顾侯邵孟龙万段雷钱汤"
            "尹黎易常武乔贺赖龚文严焦栗迟项童靖仇牛闵聂欧祁盛鲍倪柯全席封凌耿甘钦邢骆葛臧乌温荣司廖兰柴焉"
            "昝匡粟卓卫翟隋季浦蓝涂尉厉翁班路谷阿")


def categorise(term: str, seen: bool) -> tuple[str, str, str]:
    """(category, decision, reason) for one simplified term; ``seen``: it occurs in the corpora."""
    if term in COMMON_NAMES:
        return ORDINARY, "remove", "a common personal name (also an official's): users' names must be writable"
    for cat, terms in KEEP_SEEN.items():
        if term in terms:
            return cat, "keep", KEEP_REASON[cat]
    if seen:
        return ORDINARY, "remove", "an ordinary word; its corpus pairs are festive, classical or everyday lines"
    if term in UNSEEN_DEFAULT:
        return UNSEEN_DEFAULT[term]
    if len(term) > 2 and term[-1] in "部局办委署院":
        return ORDINARY, "remove", "the name of a government office"
    if term[0] == "毛" and len(term) > 2:  # upstream repeats terms behind a 毛 prefix
        cat, decision, reason = categorise(term[1:], False)
        if decision == "keep":
            return cat, decision, reason
        return ORDINARY, "remove", "an ordinary word behind upstream's 毛 prefix"

    if term in ORDINARY_UNSEEN:
        return ORDINARY, "remove", "an ordinary word (a place, an office, a game, a trade or a product)"
    for cat, pattern in RULES:
        if re.search(pattern, term):
            return cat, "keep", KEEP_REASON[cat]
    if 2 <= len(term) <= 3 and term[0] in SURNAMES:
        return POLITICAL, "keep", NAME_REASON
    return UNSEEN_DEFAULT.get(term, (ORDINARY, "remove", SPAM_REASON))


KEEP_REASON = {
    SEXUAL: "sexual or vulgar: never written, trained on or accepted from users",
    INSULT: "an insult or slur: never written, trained on or accepted from users",
    VIOLENCE: "violence or crime (threats, weapons or forged papers for sale, poisons): never written or trained on",
    DRUGS: "drugs or their precursors: never written or trained on",
    POLITICAL: "a politically sensitive phrase: never written or trained on",
}
REASON_CODES: dict[str, str] = {}  # reason -> its code in the file (filled in below)
SPAM_REASON = ("an ordinary word, or a fragment of advertising spam (contact-number spellings, shop and "
               "game names, offices) with nothing vulgar, insulting or sensitive in it")
NAME_REASON = ("the full name (or a spelling of it) of a state or party official: never written or trained "
               "on (China's Advertising Law, Art. 9: no use of state officials' names in advertising)")


# Terms absent from the corpora that the keyword rules miss (or misread), read one by one.
UNSEEN = {
    SEXUAL: words("""
隐窝窝 食精 窝窝客 采花网 凹晕 龟投 亚洲色 大波波 羞耻母 买春堂 秘唇 凸肉优 群阴会 多人轮 来爽我 巨奶
赠卵 狼友 亀头 爆乳娘 臀推 柔阴术 干的爽 小肉粒 肉箫 销魂洞 密洞 浴尿 床照 爆你菊 乳尻 含鸟 小卵子
髙潮 吞精 手拉鸡 欠人骑 拉手冲 懒八 懒叫 懒趴 扉之阴 贝肉 品香堂 男公关 凸点装 痴乳 尻庇 公媳乱 挤母奶
拳交 大卵子 大卵泡 小卵泡 姫辱 深喉 受虐狂 亚情 鞭王 宾周 给你爽 足脚交 行房 小鸡鸡 学生妹 制服狩 女尻
喷尿 放尿 藓鲍 老卵 啊无卵 鸡歪 腚眼 双臀 试看片 小电影 一夜晴 夜色城 生春袋 猛干 爆草 搞比 想上你 干我
干机 干鸡 戳你 戳比 轮流干 轮攻 抽动肉 夹阴 漏乳 蝉童 幼香阁 爱幼阁 姿丽子 速水恋 松岛枫 手岛优 风间遥
镜丽子 惠美梨 铃木麻 姫野爱 草榴 色色连 黑鲍娇 丽春苑 碧香亭 品色堂 女友坊 豆豆秀 视频秀 素人娘 芸能人
黄色靠 龙虎豹 夏川纯 脱裤门 毒龙钻 大血比 血比 采花堂 找鸡 按摩棒 校鸡 爽你 就去日 搞你 搞他 搞她 秘裂 売春妇
"""),
    INSULT: words("""
干全家 死全家 伱妈 妈个比 犯践 曰你 滥比 滥货 饿比 沙比 臭鸡 鸠屎 事屎 民猪 酱猪媳 臭机 吗个 册老
曹你 李愚蠢 屁蛋 狗产蛋 膏药旗 奴畜抄 僵贼 僵贼民
"""),
    VIOLENCE: words("""
搞死 巴雷特 伯莱塔 勃朗宁 三连发 五连发 掌心雷 热武器 灭绝罪 大黑鹰 小黑豹 驽弓 折叠军 发嘌 税票代 税据
高压狗 步狗 钢珠狗 钢针狗 土仿狗 折叠狗 电狗 战狗 汽狗 军狗 火狗 手狗 仿真狗 麻狗 气狗
做公文 做护照 做驾照 做言正 扎卡维 奥马尔 塔利班 萨达姆 本拉丹 拉丹 泄题 助考 私售
"""),
    DRUGS: words("快克 开他敏 凯他敏 三挫仑 安纳咖 可可精 可哥精 麻烟 草枝麻 草芝麻"),
    POLITICAL: words("""
屠光绍 法轮公 轮法功 揭批书 法谪 法谪功 大卫教 供铲党 供铲裆 供铲谠 公产党 工产党 党产共 产党共 拱铲 供产 新疆国 台湾国
西藏国 台湾党 台联党 建国党 民一主 敏主 抿主 民珠 民竹 四事件 一四我 四我周 回民暴 藏暴乱 截访 政治犯
藏青会 藏青社 藏妇会 世维会 多维网 多维社 博讯 大参考 新语丝 人民报 正见网 正悟网 正清网 自由门 自由网
大史记 大史纪 小参考 希藏 希葬 西葬 西奘 西臧 西脏 葬独 蔵独 硒藏 台弯 台完 台毒 福摩萨 平小邓 华过锋
茳泽民 择民 哲民 将则民 湖紧掏 囘良玉 懂文华 亢议 罢餐 罢饭 罢运 罢教 霸餐 霸课 霸工 国姆 国之母 统一教
真理教 网评员 民阵 轮子功 热比娅 辛灏年 洪哲胜 伍凡 志洪李 门肾革 锋同志 打台湾 特共 去中央 党卫兵
奚国华 舒晓琴 莫伟强 韦国清 娄义 陶驷驹 付申奇 房峰辉 肖捷 年福纯 仁青加 桑国卫 梅克保 肖亚庆 姬胜德
师春生 干以胜 邝锦文 俞杰 符跃兰 申维辰 令狐安 柳斌杰 楼继伟 关卓中 尚福林 安立敏 寇晓伟 鹿心社 章沁生
屈万祥 成克杰 郁慕明 檀鑫 由喜贵 连胜德 费良勇 戈万钧 向忠发 朝鲁 肖爱玲 华惠棋 简鸿章 滕文生 苗圩 列确
"""),
}
ORDINARY_UNSEEN = words("""
狗剩 酥痒 比的 比样 那妈 喵的 他干 丁字裤 丝袜 乳罩 胸垫 体位 处男 生殖器 精虫 避孕套 钢管舞 包夜 滚滚球 阳萎 早泄 处女膜 寂寞男 美臀
铊 肖强 肖钢 朱琳 胡嘉 全户型 丁香岛 孔雀王 黄大仙 金币网 易玩网 文学城 白小姐 高价收 高偿 史迪威 鲍威尔 黄冰
黄冰糖 金酷 艾滋病 淋病 乳房 魔兽币 买小车 证件 刀具 钢珠 警用 警衔 活体 核潜艇 核武器 射钉 咖啡因 咖啡碱
黄体酮 泼尼松 地高辛 地奈德 呋塞米 氯噻嗪 丙酮 乙醚 硅烷 甲睾酮 锡纸 代血浆 咨讯 威而钢 威而柔 乡巴佬 不玩了
你爸 你爷 你奶 他爸爸 她爸爸 它爸爸 他母亲 她娘 干娘 干嫂子 你姥 烂游戏 民进党 亲民党 自民党 满洲国 慰安妇 红卫兵 大跃进 黑五类 浮夸风 讨说法 要说法 倡议书 悔过书
同胞书 威胁论 末世论 摩门教 东正教 福音会 团派 普选 党主席 主席像 中央社 劳拉 斯蒂芬 华莱士 曼德拉 蒙巴顿
尼米兹 希拉克 布希 布雷尔 鸽派 印钞机 电驴 大力丸 盗窃犯 女死囚 可燃物 电子狗 违禁品 抑制剂 代购 开票
麻醉剂 十三点 棉条 辣妈群 政付 政俯 政一府 症腐 正府 抗曰 懊运 懊孕 奥晕 奥孕 惨奥 第四代 酥痒
""")
UNSEEN_DEFAULT: dict[str, tuple[str, str, str]] = {
    t: (cat, "keep", KEEP_REASON[cat]) for cat, ts in UNSEEN.items() for t in ts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--counts", default=str(ROOT / "benchmarks" / "results" / "2026-12-07-safety-list-pairs.json"),
                    help="scripts/blocklist_pairs.py's upstream counts (alone, or under 'upstream')")
    ap.add_argument("--out", default=str(RES / "blocklist.tsv"))
    args = ap.parse_args()
    counts = json.loads(Path(args.counts).read_text(encoding="utf-8"))
    counts = counts.get("upstream", counts)["contain"]
    raw = [t.strip() for t in (RES / "blocklist.upstream.txt").read_text(encoding="utf-8").splitlines()]
    rows = ["# The audited safety list, built by scripts/audit_blocklist.py from blocklist.upstream.txt",
            "# (see LICENSE.blocklist and docs/reference/safety-filter.md). term: as listed upstream (or",
            "# added here); simplified: the form matched; pairs: corpus pairs holding it, counted over",
            "# ../shared/data/couplets/*.tsv; forms: its other written forms, matched too (kept terms only).",
            "# reason: a code, and for a kept term that removes 20 or more pairs, why it stays:"]
    rows += [f"#   {code}: {text}" for text, code in REASON_CODES.items()]
    rows.append("term\tsimplified\tcategory\tdecision\tpairs\tforms\treason")
    for t in [t for t in raw if t] + sorted(t for t in ADDED if t not in raw):
        simp = t if len(t) == 1 else str(zhconv.convert(t, "zh-cn"))
        cat, decision, reason = categorise(simp, simp in counts)
        if t in ADDED:
            cat, decision, reason = ADDED[t], "keep", ADDED_REASON
        forms = ""
        if decision == "keep":
            alt = {t} | {str(zhconv.convert(simp, v)) for v in ("zh-hant", "zh-tw", "zh-hk")}
            forms = " ".join(sorted(f for f in alt if f != simp and len(f) == len(simp)))
        code = REASON_CODES.setdefault(reason, f"r{len(REASON_CODES)}")
        if decision == "keep" and STAY.get(simp, "official") != "official":
            code = f"{code}: {STAY[simp]}"
        rows.append("\t".join([t, simp, cat, decision, str(counts.get(simp, 0)), forms, code]))
    Path(args.out).write_text("\n".join(rows) + "\n", encoding="utf-8")


# Why the kept terms that remove 20 or more corpus pairs stay (the file's reason column).
STAY = {
    "淫": "obscene in its modern sense; the cost is classical lines (淫雨, 富贵不能淫): 474 pairs",
    "妓": "prostitution; its pairs (歌妓, 妓女) are never festive",
    "杀人": "violence; no festive line says it; its pairs are classical and satirical",
    "一夜情": "casual sex; its pairs are satire",
    "嫖": "prostitution", "娼": "prostitution", "鸨": "prostitution (老鸨)", "三陪": "prostitution",
    "屎": "crude; never festive",
    "台独": "separatism; its pairs are polemics a campaign never writes",
    "屠城": "massacre; its pairs are memorial lines, never festive",
    "小日本": "an ethnic slur", "杂种": "an insult", "狗屁": "vulgar", "瘪三": "an insult",
    "土共": "a derogatory political term",
    "毛泽东": "official", "邓小平": "official",
}

# Vulgar and insulting terms upstream lacks (the must-block list of tests/unit/test_safety_lists.py).
ADDED_REASON = "added here (upstream lacks it): vulgar or insulting, never written, trained on or accepted"
ADDED: dict[str, str] = {t: SEXUAL for t in words("肏你妈 草泥马 屌你妈")} | {
    t: INSULT for t in words("狗娘养的 去你妈的 操你祖宗 你妈逼 滚你妈")}

REASON_CODES.update({
    KEEP_REASON[SEXUAL]: "sexual", KEEP_REASON[INSULT]: "insult", KEEP_REASON[VIOLENCE]: "violence",
    KEEP_REASON[DRUGS]: "drugs", KEEP_REASON[POLITICAL]: "political", NAME_REASON: "official",
    ADDED_REASON: "added", SPAM_REASON: "spam",
    "an ordinary word; its corpus pairs are festive, classical or everyday lines": "ordinary",
    "a common personal name (also an official's): users' names must be writable": "name",
    "an ordinary word (a place, an office, a game, a trade or a product)": "word",
    "the name of a government office": "office",
    "an ordinary word behind upstream's 毛 prefix": "prefixed",
})

if __name__ == "__main__":
    main()
